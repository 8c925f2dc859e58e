#include "coordinator/serving_metrics.h"

#include <iterator>

#include "absl/strings/str_cat.h"

namespace flotilla::coordinator {
namespace {

// Latencies from milliseconds up to 30 minutes (long prompts, slow queues
// and long generations are what an operator most needs to see).
std::vector<double> LatencyBuckets(std::vector<double> small) {
  for (double b : {1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0}) {
    small.push_back(b);
  }
  return small;
}

}  // namespace

const char* FinishedReasonName(FinishedReason reason) {
  static constexpr const char* kNames[] = {"stop", "length", "cancelled", "deadline", "error"};
  static_assert(std::size(kNames) == static_cast<size_t>(FinishedReason::kCount));
  return kNames[static_cast<int>(reason)];
}

FinishedReason FailedReason(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kCancelled:
      return FinishedReason::kCancelled;
    case absl::StatusCode::kDeadlineExceeded:
      return FinishedReason::kDeadline;
    default:
      return FinishedReason::kError;
  }
}

std::string PrometheusLabelValue(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

std::string ModelLabel(const std::string& model_id) {
  return absl::StrCat("model_name=\"", PrometheusLabelValue(model_id), "\"");
}

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1) {}

void Histogram::Observe(double v) {
  std::lock_guard<std::mutex> l(mu_);
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) ++i;
  ++counts_[i];
  sum_ += v;
  ++count_;
}

void Histogram::Render(const std::string& name, const std::string& help, const std::string& labels,
                       std::string& out) const {
  absl::StrAppend(&out, "# HELP ", name, " ", help, "\n# TYPE ", name, " histogram\n");
  RenderSeries(name, labels, out);
}

void Histogram::RenderSeries(const std::string& name, const std::string& labels,
                             std::string& out) const {
  std::lock_guard<std::mutex> l(mu_);
  const std::string prefix = labels.empty() ? "" : labels + ",";
  const std::string alone = labels.empty() ? "" : absl::StrCat("{", labels, "}");
  uint64_t cum = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cum += counts_[i];
    absl::StrAppend(&out, name, "_bucket{", prefix, "le=\"", bounds_[i], "\"} ", cum, "\n");
  }
  cum += counts_.back();
  absl::StrAppend(&out, name, "_bucket{", prefix, "le=\"+Inf\"} ", cum, "\n", name, "_sum", alone,
                  " ", sum_, "\n", name, "_count", alone, " ", count_, "\n");
}

ServingMetrics::ServingMetrics()
    : ttft(LatencyBuckets({0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5})),
      itl({0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}),
      e2e(LatencyBuckets({0.05, 0.1, 0.25, 0.5})),
      queue_time(LatencyBuckets({0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5})),
      prefill_time(LatencyBuckets({0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5})),
      decode_time(LatencyBuckets({0.01, 0.025, 0.05, 0.1, 0.25, 0.5})) {}

void ServingMetrics::Finished(const absl::Status& status, const cluster::SequenceUpdate* last) {
  FinishedReason reason = FinishedReason::kError;
  if (status.ok() && last != nullptr) {
    if (last->finish_reason() == common::STOP) reason = FinishedReason::kStop;
    if (last->finish_reason() == common::LENGTH) reason = FinishedReason::kLength;
    if (last->finish_reason() == common::STOP || last->finish_reason() == common::LENGTH) {
      queue_time.Observe(last->queue_time_ms() / 1000.0);
      prefill_time.Observe(last->prefill_time_ms() / 1000.0);
      decode_time.Observe(last->decode_time_ms() / 1000.0);
    }
  } else if (!status.ok()) {
    reason = FailedReason(status);
  }
  ++finished[static_cast<int>(reason)];
}

void ServingMetrics::Render(const std::string& labels, std::string& out) const {
  RenderAll({{labels, this}}, out);
}

void ServingMetrics::RenderAll(const std::vector<Part>& parts, std::string& out) {
  auto header = [&out](const char* name, const char* type, const char* help) {
    absl::StrAppend(&out, "# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n");
  };
  auto alone = [](const std::string& labels) {
    return labels.empty() ? std::string() : absl::StrCat("{", labels, "}");
  };
  auto prefix = [](const std::string& labels) {
    return labels.empty() ? std::string() : labels + ",";
  };
  header("flotilla_prompt_tokens_total", "counter", "prompt tokens of admitted requests");
  for (const auto& [labels, m] : parts) {
    absl::StrAppend(&out, "flotilla_prompt_tokens_total", alone(labels), " ",
                    m->prompt_tokens.load(), "\n");
  }
  header("flotilla_generation_tokens_total", "counter",
         "tokens generated (end tokens included)");
  for (const auto& [labels, m] : parts) {
    absl::StrAppend(&out, "flotilla_generation_tokens_total", alone(labels), " ",
                    m->generation_tokens.load(), "\n");
  }
  header("flotilla_requests_finished_total", "counter",
         "requests ended, by how: stop (an end token, stop token or stop string), length "
         "(max_tokens or the context), cancelled (by the client or its disconnect), deadline, "
         "error");
  for (const auto& [labels, m] : parts) {
    for (int r = 0; r < static_cast<int>(FinishedReason::kCount); ++r) {
      absl::StrAppend(&out, "flotilla_requests_finished_total{", prefix(labels),
                      "finished_reason=\"", FinishedReasonName(static_cast<FinishedReason>(r)),
                      "\"} ", m->finished[r].load(), "\n");
    }
  }
  header("flotilla_requests_migrated_total", "counter",
         "requests that continued on another instance (or the same one re-formed) after theirs "
         "failed or was drained, counted on the instance they left");
  for (const auto& [labels, m] : parts) {
    absl::StrAppend(&out, "flotilla_requests_migrated_total", alone(labels), " ",
                    m->migrated.load(), "\n");
  }
  struct Hist {
    const char* name;
    const char* help;
    const Histogram ServingMetrics::*member;
  };
  static constexpr Hist kHists[] = {
      {"flotilla_time_to_first_token_seconds",
       "time from admission to the first generated token (gRPC and HTTP)", &ServingMetrics::ttft},
      {"flotilla_inter_token_latency_seconds",
       "time between generated tokens of one request (gRPC and HTTP)", &ServingMetrics::itl},
      {"flotilla_request_duration_seconds", "time from admission to the last token",
       &ServingMetrics::e2e},
      {"flotilla_request_queue_time_seconds",
       "time a finished request waited on its worker before it was admitted to the batch",
       &ServingMetrics::queue_time},
      {"flotilla_request_prefill_time_seconds",
       "time from admission to the batch to the first token (the prompt's prefill)",
       &ServingMetrics::prefill_time},
      {"flotilla_request_decode_time_seconds", "time from the first token to the last",
       &ServingMetrics::decode_time},
  };
  for (const Hist& h : kHists) {
    header(h.name, "histogram", h.help);
    for (const auto& [labels, m] : parts) (m->*h.member).RenderSeries(h.name, labels, out);
  }
}

}  // namespace flotilla::coordinator
