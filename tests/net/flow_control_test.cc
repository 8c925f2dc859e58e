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
#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "proto/flotilla.grpc.pb.h"
#include "tools/cli/local_cluster.h"

namespace flotilla {
namespace {
namespace fs = std::filesystem;
using Json = nlohmann::json;

constexpr int kGrpcReaders = 8;
constexpr int kHttpReaders = 8;
// An integer from the environment, else `fallback`.
int EnvInt(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v == nullptr ? fallback : std::atoi(v);
}
// How long the clients that do not read keep coming back.
const std::chrono::seconds kPressure(EnvInt("FLOTILLA_FLOW_TEST_SECONDS", 20));
// A prompt whose logits (786 KiB a token: the real vocabulary) come in two
// messages, over the stream bound below (computing them is slow on a CPU).
const int kPromptTokens = EnvInt("FLOTILLA_FLOW_TEST_PROMPT_TOKENS", 4);
// How long a client holds a stream it does not read before it cancels it.
const std::chrono::seconds kHold(EnvInt("FLOTILLA_FLOW_TEST_HOLD_SECONDS", 4));

// VmRSS of `pid` in kB; -1 when unreadable.
long RssKb(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  }
  return -1;
}

std::string Host(const std::string& address) { return address.substr(0, address.rfind(':')); }
int Port(const std::string& address) { return std::stoi(address.substr(address.rfind(':') + 1)); }

// A channel of its own (no shared connection, so one stream's unread bytes
// do not hold up another's window).
std::unique_ptr<v1::Flotilla::Stub> Stub(const std::string& address, int index) {
  grpc::ChannelArguments args;
  args.SetInt("flotilla.test.channel", index);
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return v1::Flotilla::NewStub(
      grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args));
}

// One gRPC client that asks for prompt logits and never reads: each stream
// is held for a few seconds, then cancelled, then another one opened.
struct NeverReader {
  int streams = 0;
  int not_ok = 0;  // streams that did not end OK (ended by the server, or cancelled here)
  std::string last_error;
  void Run(const std::string& address, int index, std::chrono::steady_clock::time_point until) {
    auto stub = Stub(address, index);
    v1::GenerateRequest req;
    for (int i = 0; i < kPromptTokens; ++i) {
      req.mutable_prompt_ids()->add_ids((i * 7919 + index) % 1000 + 1);
    }
    req.mutable_sampling()->set_max_tokens(1);
    req.set_return_prompt_logits(true);
    while (std::chrono::steady_clock::now() < until) {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
      std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader = stub->Generate(&ctx, req);
      ++streams;
      std::this_thread::sleep_for(kHold);
      ctx.TryCancel();
      const grpc::Status st = reader->Finish();
      if (!st.ok()) ++not_ok, last_error = st.error_message();
    }
  }
};

// One HTTP client that streams a long chat completion (20 top logprobs a
// token, so each event is large) and reads it 256 bytes every 100 ms through
// a small receive buffer; over again when the server ends it.
struct SlowReader {
  int streams = 0;
  int cut = 0;       // streams the server ended before [DONE]
  int finished = 0;  // streams read to [DONE]
  void Run(const std::string& address, const std::string& model, int index,
           std::chrono::steady_clock::time_point until) {
    const std::string body =
        Json{{"model", model},
             {"messages", {{{"role", "user"}, {"content", "Tell me a long story."}}}},
             {"stream", true},
             {"max_tokens", 3000},
             {"logprobs", true},
             {"top_logprobs", 20},
             {"seed", index}}
            .dump();
    const std::string request = "POST /v1/chat/completions HTTP/1.1\r\nHost: " + address +
                                "\r\nContent-Type: application/json\r\nContent-Length: " +
                                std::to_string(body.size()) + "\r\n\r\n" + body;
    while (std::chrono::steady_clock::now() < until) {
      const int fd = socket(AF_INET, SOCK_STREAM, 0);
      ASSERT_GE(fd, 0);
      int small = 4096;
      setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
      timeval timeout{30, 0};
      setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
      sockaddr_in to{};
      to.sin_family = AF_INET;
      to.sin_port = htons(static_cast<uint16_t>(Port(address)));
      inet_pton(AF_INET, Host(address).c_str(), &to.sin_addr);
      ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)), 0);
      ASSERT_EQ(send(fd, request.data(), request.size(), MSG_NOSIGNAL),
                static_cast<ssize_t>(request.size()));
      ++streams;
      std::string tail;  // the last bytes read, to see [DONE]
      bool done = false;
      while (std::chrono::steady_clock::now() < until) {
        char buf[256];
        const ssize_t n = recv(fd, buf, sizeof(buf), 0);
        if (n <= 0) break;
        tail.append(buf, static_cast<size_t>(n));
        if (tail.find("[DONE]") != std::string::npos) done = true;
        if (tail.size() > 64) tail.erase(0, tail.size() - 64);
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
      close(fd);
      if (done) {
        ++finished;
      } else if (std::chrono::steady_clock::now() < until) {
        ++cut;
      }
    }
  }
};

// The value of series `name` on the coordinator's /metrics (-1: unreadable,
// 0: absent).
double Metric(const std::string& http_address, const std::string& name) {
  httplib::Client c("http://" + http_address);
  c.set_read_timeout(30, 0);
  auto res = c.Get("/metrics");
  if (!res || res->status != 200) return -1;
  std::istringstream lines(res->body);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind(name, 0) != 0 || line.size() <= name.size()) continue;
    if (line[name.size()] != '{' && line[name.size()] != ' ') continue;
    return std::stod(line.substr(line.rfind(' ') + 1));
  }
  return 0;
}

// An ordinary client: a short gRPC generation and a short HTTP chat, both
// complete and OK.
void ExpectServed(const cli::LocalCluster& cluster, const std::string& model) {
  auto stub = Stub(cluster.address(), 1000);
  v1::GenerateRequest req;
  for (int t : {1, 2, 3, 4, 5}) req.mutable_prompt_ids()->add_ids(t);
  req.mutable_sampling()->set_max_tokens(4);
  req.mutable_sampling()->set_ignore_eos(true);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
  auto reader = stub->Generate(&ctx, req);
  v1::GenerateResponse resp;
  int tokens = 0;
  while (reader->Read(&resp)) tokens += resp.token_ids_size();
  const grpc::Status st = reader->Finish();
  EXPECT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(tokens, 4);

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
  // Small bounds (unless the environment says otherwise): 64 KiB a stream,
  // 1 MiB in all, one second of grace.
  setenv("FLOTILLA_MAX_STREAM_BUFFER_BYTES", "65536", 0);
  setenv("FLOTILLA_MAX_CLIENT_BUFFER_BYTES", "1048576", 0);
  setenv("FLOTILLA_CLIENT_STALL_TIMEOUT_S", "1", 0);
  cli::LocalClusterOptions o;
  o.workers = 1;
  o.threads_per_worker = 1;
  // A loaded 2-core machine may delay a heartbeat: that is not this test's subject.
  o.heartbeat_timeout_ms = 15000;
  o.bin_dir = FLOTILLA_BIN_DIR;
  o.log_dir = (fs::temp_directory_path() / ("flotilla-flow-control-" + std::to_string(getpid())))
                  .string();
  auto cluster = cli::LocalCluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::string model = (*cluster)->model().substr((*cluster)->model().find_last_of('/') + 1);
  const pid_t pid = (*cluster)->coordinator_pid();

  // Warm: the first requests' one-time allocations are not growth.
  ExpectServed(**cluster, model);
  const long rss_start = RssKb(pid);

  const auto until = std::chrono::steady_clock::now() + kPressure;
  std::vector<NeverReader> never(kGrpcReaders);
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
  int served = 0;
  while (std::chrono::steady_clock::now() < until) {
    rss_peak = std::max(rss_peak, RssKb(pid));
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
  std::cout << "coordinator RSS: " << rss_start / 1024 << " MiB at start, peak "
            << rss_peak / 1024 << " MiB under " << kGrpcReaders << " never-reading gRPC and "
            << kHttpReaders << " slow HTTP clients (" << grpc_streams << " and " << http_streams
            << " streams; " << http_cut << " HTTP streams cut, " << http_finished
            << " finished; " << ended << " streams ended by the bounds), " << rss_after / 1024
            << " MiB after\n";
  EXPECT_GT(ended, 0) << "the bounds ended streams; a gRPC stream ended with: "
                       << never[0].last_error;
  EXPECT_GT(http_cut, 0) << "slow HTTP readers were cut off";
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
