// A test suite sharing one local cluster (`flotilla up`'s processes, started
// once for the suite), and reading its /metrics: what the end-to-end API
// suites of tests/grpc and tests/http have in common. A suite derives from
// LocalClusterSuite<itself> and may define
//   static void Configure(cli::LocalClusterOptions& options);
// to change the one-worker, one-thread default before the start. Its target
// defines FLOTILLA_BIN_DIR (where the programs were built).
#pragma once

#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <cstdlib>
#include <regex>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "tools/cli/local_cluster.h"

namespace flotilla::testing_util {

// A gauge or counter of the Prometheus text `metrics`: the first series named
// `name` (with any labels); -1 when there is none.
inline double MetricValue(const std::string& metrics, const std::string& name) {
  std::smatch found;
  if (!std::regex_search(metrics, found,
                         std::regex("(^|\n)" + name + "(\\{[^}]*\\})? ([0-9.e+-]+)"))) {
    return -1;
  }
  return std::stod(found[3]);
}

// The same read from the /metrics of the HTTP server at `http_address`.
inline double ScrapeMetric(const std::string& http_address, const std::string& name) {
  httplib::Client client("http://" + http_address);
  auto metrics = client.Get("/metrics");
  return metrics ? MetricValue(metrics->body, name) : -1;
}

template <typename Suite>
class LocalClusterSuite : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    setenv("FLOTILLA_BIN_DIR", FLOTILLA_BIN_DIR, 1);
    cli::LocalClusterOptions options;
    options.workers = 1;
    options.threads_per_worker = 1;
    Suite::Configure(options);
    // A cluster that does not start fails each test (SetUp): a fatal failure
    // here would make gtest report the tests skipped, which ctest counts so.
    auto started = cli::LocalCluster::Start(options);
    if (started.ok()) {
      cluster_ = started->release();
    } else {
      start_error_ = started.status();
    }
  }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
  }
  void SetUp() override {
    ASSERT_NE(cluster_, nullptr) << "the suite's cluster did not start: " << start_error_;
  }

  // The default: one worker of one thread.
  static void Configure(cli::LocalClusterOptions&) {}

  // The model id clients name.
  static std::string Model() { return cluster_->model_id(); }
  // Where /metrics is read without a key: the HTTP API's address; a suite
  // whose cluster has API keys names its --metrics-listen address instead.
  static std::string MetricsAddress() { return cluster_->http_address(); }
  // A gauge or counter from /metrics (any labels); -1 when missing.
  static double Metric(const std::string& name) {
    return ScrapeMetric(Suite::MetricsAddress(), name);
  }
  // Waits until nothing runs: no request in flight at the coordinator and no
  // sequence running or queued on the workers (a worker reports turning busy
  // before its first tokens and idle right after its last ones, so once the
  // requests have their answers these figures, and the counters beside them,
  // are the workers' own); false after 20 s, a bound for a test that would
  // otherwise hang, not a measurement.
  static bool WaitIdle() {
    for (int i = 0; i < 200; ++i) {
      if (Metric("flotilla_requests_in_flight") == 0 && Metric("flotilla_running_sequences") == 0 &&
          Metric("flotilla_queued_sequences") == 0)
        return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return false;
  }

  static inline cli::LocalCluster* cluster_ = nullptr;
  static inline absl::Status start_error_;
};

}  // namespace flotilla::testing_util
