// Flow control end to end on a real CPU cluster: clients that do not read
// what they asked for (gRPC prompt-logits streams never read, HTTP streams
// read a few bytes at a time) cannot grow the coordinator's memory: their
// streams are ended once over their bound (small here, set through the
// FLOTILLA_* variables, so the effect comes within seconds), the memory goes
// back after they leave, and another client is served meanwhile.
//
// The bounds come from the environment when it sets them already, so the same
// program runs the defaults or no bounds at all (e.g.
// FLOTILLA_MAX_STREAM_BUFFER_BYTES=1000000000000), and
// FLOTILLA_FLOW_TEST_SECONDS, FLOTILLA_FLOW_TEST_PROMPT_TOKENS and
// FLOTILLA_FLOW_TEST_HOLD_SECONDS scale the pressure (issue 28's scenario:
// 60 s, large prompt-logits answers held unread).
#include <gtest/gtest.h>
#include <httplib.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "tests/net/hostile_clients.h"
#include "tools/cli/local_cluster.h"

namespace flotilla {
namespace {
namespace fs = std::filesystem;
using Json = nlohmann::json;
using flow_test::EnvInt;
using flow_test::Metric;
using flow_test::NeverReader;
using flow_test::RssKb;
using flow_test::SlowReader;

// The clients of each kind (FLOTILLA_FLOW_TEST_GRPC_READERS and
// FLOTILLA_FLOW_TEST_HTTP_READERS: one kind alone shows what it costs).
const int kGrpcReaders = EnvInt("FLOTILLA_FLOW_TEST_GRPC_READERS", 8);
const int kHttpReaders = EnvInt("FLOTILLA_FLOW_TEST_HTTP_READERS", 8);
// How long the clients that do not read keep coming back.
const std::chrono::seconds kPressure(EnvInt("FLOTILLA_FLOW_TEST_SECONDS", 20));
// A prompt whose logits (786 KiB a token: the real vocabulary) come in two
// messages, over the stream bound below (computing them is slow on a CPU).
const int kPromptTokens = EnvInt("FLOTILLA_FLOW_TEST_PROMPT_TOKENS", 4);
// How long a client holds a stream it does not read before it cancels it.
const std::chrono::seconds kHold(EnvInt("FLOTILLA_FLOW_TEST_HOLD_SECONDS", 4));

// An ordinary client: a short gRPC generation and a short HTTP chat, both
// complete and OK.
void ExpectServed(const cli::LocalCluster& cluster, const std::string& model) {
  std::string error;
  EXPECT_GT(flow_test::TimedGenerate(cluster.address(), 4, &error).count(), 0) << error;

  httplib::Client c("http://" + cluster.http_address());
  c.set_read_timeout(120, 0);
  const Json body{{"model", model},
                  {"messages", {{{"role", "user"}, {"content", "Hi"}}}},
                  {"max_tokens", 4}};
  auto res = c.Post("/v1/chat/completions", body.dump(), "application/json");
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  EXPECT_EQ(res->status, 200) << res->body;
}

TEST(FlowControl, ClientsThatDoNotReadCannotGrowTheCoordinator) {
  const cli::LocalClusterOptions o = flow_test::FlowControlCluster("flow-control");
  auto cluster = cli::LocalCluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::string model = (*cluster)->model().substr((*cluster)->model().find_last_of('/') + 1);
  const pid_t pid = (*cluster)->coordinator_pid();

  // Warm: the first requests' one-time allocations are not growth.
  ExpectServed(**cluster, model);
  const long rss_start = RssKb(pid);

  const auto until = std::chrono::steady_clock::now() + kPressure;
  std::vector<NeverReader> never(kGrpcReaders);
  for (NeverReader& r : never) r.prompt_tokens = kPromptTokens, r.hold = kHold;
  std::vector<SlowReader> slow(kHttpReaders);
  std::vector<std::thread> threads;
  for (int i = 0; i < kGrpcReaders; ++i) {
    threads.emplace_back([&, i] { never[i].Run((*cluster)->address(), i, until); });
  }
  for (int i = 0; i < kHttpReaders; ++i) {
    threads.emplace_back([&, i] { slow[i].Run((*cluster)->http_address(), model, i, until); });
  }
  // While they press: the peak of the coordinator's memory, and an ordinary
  // client served (twice, mid-way).
  long rss_peak = rss_start;
  double counted_peak = 0;  // the bytes the bounds count, sampled every second
  int served = 0;
  for (int tick = 0; std::chrono::steady_clock::now() < until; ++tick) {
    rss_peak = std::max(rss_peak, RssKb(pid));
    if (tick % 10 == 0) {
      counted_peak = std::max(counted_peak,
                              Metric((*cluster)->http_address(), "flotilla_client_buffer_bytes"));
    }
    if (served < 2 && std::chrono::steady_clock::now() > until - kPressure / 2) {
      ExpectServed(**cluster, model);
      ++served;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  for (std::thread& t : threads) t.join();
  const double ended = Metric((*cluster)->http_address(), "flotilla_client_streams_ended_total");

  // Gone: the streams' memory goes back (the watchdog trims the heap).
  long rss_after = RssKb(pid);
  for (int i = 0; i < 100 && rss_after - rss_start > 50 * 1024; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    rss_after = RssKb(pid);
  }
  int grpc_streams = 0, grpc_not_ok = 0, http_streams = 0, http_cut = 0, http_finished = 0;
  for (const NeverReader& r : never) grpc_streams += r.streams, grpc_not_ok += r.not_ok;
  for (const SlowReader& r : slow) {
    http_streams += r.streams, http_cut += r.cut, http_finished += r.finished;
  }
  std::cout << "coordinator RSS: " << rss_start / 1024 << " MiB at start, peak " << rss_peak / 1024
            << " MiB under " << kGrpcReaders << " never-reading gRPC and " << kHttpReaders
            << " slow HTTP clients (" << grpc_streams << " and " << http_streams << " streams; "
            << http_cut << " HTTP streams cut, " << http_finished << " finished; " << ended
            << " streams ended by the bounds; at most " << counted_peak / (1 << 20)
            << " MiB counted for clients), " << rss_after / 1024 << " MiB after\n";
  EXPECT_GT(ended, 0) << "the bounds ended streams; a gRPC stream ended with: "
                       << never[0].last_error;
  // With the test's small stream bound the slow readers are cut off; with
  // larger ones (the defaults) the kernel's socket buffers absorb what they
  // leave unread, nothing waits here, and nothing is cut.
  if (kHttpReaders > 0 && EnvInt("FLOTILLA_MAX_STREAM_BUFFER_BYTES", 0) <= 65536) {
    EXPECT_GT(http_cut, 0) << "slow HTTP readers were cut off";
  }
  EXPECT_EQ(grpc_not_ok, grpc_streams);
  EXPECT_LT(rss_peak - rss_start, 100 * 1024) << "kB of growth while they pressed";
  EXPECT_LT(rss_after - rss_start, 50 * 1024) << "kB kept after they left";
  double open = -1;
  for (int i = 0; i < 300 && open != 0; ++i) {
    open = Metric((*cluster)->http_address(), "flotilla_client_requests_open");
    if (open != 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(open, 0) << "requests still counted open after their clients left";
  ExpectServed(**cluster, model);
  EXPECT_TRUE((*cluster)->CheckAlive().ok());
}

}  // namespace
}  // namespace flotilla
