#include "coordinator/serving_metrics.h"

#include "absl/strings/str_cat.h"

namespace flotilla::coordinator {

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

void Histogram::Render(const std::string& name, const std::string& help, std::string& out) const {
  std::lock_guard<std::mutex> l(mu_);
  absl::StrAppend(&out, "# HELP ", name, " ", help, "\n# TYPE ", name, " histogram\n");
  uint64_t cum = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cum += counts_[i];
    absl::StrAppend(&out, name, "_bucket{le=\"", bounds_[i], "\"} ", cum, "\n");
  }
  cum += counts_.back();
  absl::StrAppend(&out, name, "_bucket{le=\"+Inf\"} ", cum, "\n", name, "_sum ", sum_, "\n", name,
                  "_count ", count_, "\n");
}

ServingMetrics::ServingMetrics()
    : ttft({0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}),
      itl({0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5}),
      e2e({0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120}) {}

void ServingMetrics::Render(std::string& out) const {
  absl::StrAppend(&out, "# HELP flotilla_prompt_tokens_total prompt tokens of admitted requests\n",
                  "# TYPE flotilla_prompt_tokens_total counter\nflotilla_prompt_tokens_total ",
                  prompt_tokens.load(), "\n");
  absl::StrAppend(&out,
                  "# HELP flotilla_generation_tokens_total tokens generated (end tokens included)\n",
                  "# TYPE flotilla_generation_tokens_total counter\nflotilla_generation_tokens_total ",
                  generation_tokens.load(), "\n");
  ttft.Render("flotilla_time_to_first_token_seconds",
              "time from admission to the first generated token (gRPC and HTTP)", out);
  itl.Render("flotilla_inter_token_latency_seconds",
             "time between generated tokens of one request (gRPC and HTTP)", out);
  e2e.Render("flotilla_request_duration_seconds", "time from admission to the last token", out);
}

}  // namespace flotilla::coordinator
