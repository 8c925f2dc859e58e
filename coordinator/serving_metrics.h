// Latency and token metrics of every request the coordinator serves, whatever
// API it came through (gRPC Generate/Chat or HTTP): the cluster manager wraps
// each request's callbacks, and /metrics renders them in Prometheus text,
// every series labelled with the served model (model_name, as vLLM does).
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "proto/cluster.pb.h"

namespace flotilla::coordinator {

// A Prometheus histogram (cumulative buckets, sum, count). Thread-safe.
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void Observe(double v);
  // `labels` (e.g. model_name="m") go on every series, before `le`.
  void Render(const std::string& name, const std::string& help, const std::string& labels,
              std::string& out) const;
  // The series alone (no HELP/TYPE lines), for one metric of several parts.
  void RenderSeries(const std::string& name, const std::string& labels, std::string& out) const;

 private:
  mutable std::mutex mu_;
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;
  double sum_ = 0;
  uint64_t count_ = 0;
};

// How requests ended, as flotilla_requests_finished_total counts them.
enum class FinishedReason { kStop, kLength, kCancelled, kDeadline, kError, kCount };

// "stop", "length", "cancelled", "deadline", "error": the metric's label and
// the access log's finish_reason.
const char* FinishedReasonName(FinishedReason reason);
// How a request that ended with `status` (not OK) finished: cancelled,
// past its deadline, or failed.
FinishedReason FailedReason(const absl::Status& status);

struct ServingMetrics {
  ServingMetrics();
  Histogram ttft;  // admission to the first generated token
  Histogram itl;   // between generated tokens of one request
  Histogram e2e;   // admission to the last token
  // The leader's view of finished requests: waiting, prefill, decode.
  Histogram queue_time;
  Histogram prefill_time;
  Histogram decode_time;
  std::atomic<uint64_t> prompt_tokens{0};
  std::atomic<uint64_t> generation_tokens{0};
  std::atomic<uint64_t> finished[static_cast<int>(FinishedReason::kCount)] = {};
  std::atomic<uint64_t> migrated{0};  // requests that left this instance for another

  // Counts a request's end: the status its on_done got and, when it finished
  // normally, the last update (its finish reason and the leader's timings).
  void Finished(const absl::Status& status, const cluster::SequenceUpdate* last);

  // Appends every series, each with `labels` (model_name="...").
  void Render(const std::string& labels, std::string& out) const;
  // One metrics object per instance, each with its labels (model_name and
  // instance); every metric's HELP and TYPE once.
  using Part = std::pair<std::string, const ServingMetrics*>;
  static void RenderAll(const std::vector<Part>& parts, std::string& out);
};

// model_name="ID", escaped for Prometheus.
std::string ModelLabel(const std::string& model_id);
// A label value escaped for Prometheus (backslash, quote, newline).
std::string PrometheusLabelValue(const std::string& value);

}  // namespace flotilla::coordinator
