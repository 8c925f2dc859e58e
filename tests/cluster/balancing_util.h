// Helpers of the expert-balancing cluster tests (CPU and GPU): greedy
// streams with their largest gap between tokens, a steady load of
// concurrent streams, and flotillactl run as the operator would.
#pragma once

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <fstream>
#include <iterator>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "proto/flotilla.grpc.pb.h"
#include "tests/cluster/greedy_client.h"
#include "tests/run_command.h"
#include "tools/cli/local_cluster.h"

namespace flotilla::balancing_test {

using Stream = cluster_test::Streamed;

// A greedy stream (with its largest gap between tokens) of 60 s at most.
inline Stream Generate(const std::string& address, const std::vector<int32_t>& prompt,
                       int max_tokens) {
  return cluster_test::GreedyGenerate(address, prompt, max_tokens, {.deadline_s = 60});
}

// Concurrent streams of varied prompts until stopped; counts failures.
class Load {
 public:
  Load(std::string address, int streams) {
    for (int i = 0; i < streams; ++i) {
      threads_.emplace_back([this, address, i] {
        for (int n = 0; !stop_; ++n) {
          std::vector<int32_t> prompt;
          for (int t = 0; t < 6 + (n + i) % 5; ++t)
            prompt.push_back((i * 131 + n * 17 + t * 7) % 1000 + 1);
          Stream s = Generate(address, prompt, 12);
          std::lock_guard<std::mutex> lock(mu_);
          ++done_;
          if (!s.status.ok()) failures_.push_back(s.status.error_message());
          largest_gap_s_ = std::max(largest_gap_s_, s.largest_gap_s);
        }
      });
    }
  }
  ~Load() { Stop(); }
  void Stop() {
    stop_ = true;
    for (auto& t : threads_) {
      if (t.joinable()) t.join();
    }
  }
  int done() {
    std::lock_guard<std::mutex> lock(mu_);
    return done_;
  }
  std::vector<std::string> failures() {
    std::lock_guard<std::mutex> lock(mu_);
    return failures_;
  }
  double largest_gap_s() {
    std::lock_guard<std::mutex> lock(mu_);
    return largest_gap_s_;
  }

 private:
  std::atomic<bool> stop_{false};
  std::vector<std::thread> threads_;
  std::mutex mu_;
  int done_ = 0;
  std::vector<std::string> failures_;
  double largest_gap_s_ = 0;
};

inline nlohmann::json Ctl(const std::string& bin_dir, const cli::LocalCluster& cluster,
                          const std::string& args) {
  const std::string cmd =
      bin_dir + "/flotillactl --coordinator " + cluster.address() + " --json " + args;
  auto [rc, out] = testing_util::RunCommandWithStderr(cmd);
  EXPECT_EQ(rc, 0) << cmd << "\n" << out;
  nlohmann::json j = nlohmann::json::parse(out, nullptr, /*allow_exceptions=*/false);
  EXPECT_FALSE(j.is_discarded()) << out;
  return j;
}

// Expert load of the current map over the last `window` seconds, once it
// covers at least `min_rows` expert rows.
inline nlohmann::json MeasuredLoad(const std::string& bin_dir, const cli::LocalCluster& cluster,
                                   int window, uint64_t min_rows) {
  nlohmann::json j;
  for (int i = 0; i < 100; ++i) {
    j = Ctl(bin_dir, cluster, "experts --window " + std::to_string(window));
    if (j.is_object() && j["total_tokens"].get<uint64_t>() >= min_rows &&
        j["window_seconds"].get<double>() >= window - 0.5) {
      return j;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  return j;
}

// The step at which each worker's log says it switched to `version`
// ("switched to expert map version V at step N"); -1 where it does not.
inline std::vector<int64_t> SwitchSteps(const std::string& log_dir, int workers, uint64_t version) {
  std::vector<int64_t> out;
  const std::string needle =
      "switched to expert map version " + std::to_string(version) + " at step ";
  for (int i = 0; i < workers; ++i) {
    std::ifstream log(log_dir + "/worker-" + std::to_string(i) + ".log");
    std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
    const size_t at = text.find(needle);
    out.push_back(at == std::string::npos ? -1 : std::stoll(text.substr(at + needle.size())));
  }
  return out;
}

}  // namespace flotilla::balancing_test
