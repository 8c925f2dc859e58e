// The serving metrics as Prometheus reads them: every series labelled with
// the model, finish reasons, queue / prefill / decode histograms with buckets
// up to 30 minutes; and the access log's record of a request.
#include "coordinator/serving_metrics.h"

#include <gtest/gtest.h>

#include <array>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "coordinator/access_log.h"

namespace flotilla::coordinator {
namespace {

bool Has(const std::string& text, const std::string& line) {
  return text.find(line) != std::string::npos;
}

TEST(ServingMetrics, FinishReasonsAndLeaderTimingsAreCountedWithTheModelLabel) {
  ServingMetrics m;
  cluster::SequenceUpdate last;
  last.set_finish_reason(common::LENGTH);
  last.set_queue_time_ms(1500);
  last.set_prefill_time_ms(250);
  last.set_decode_time_ms(1'200'000);  // 20 minutes: inside the last finite bucket
  m.Finished(absl::OkStatus(), &last);
  last.set_finish_reason(common::STOP);
  m.Finished(absl::OkStatus(), &last);
  m.Finished(absl::CancelledError("bye"), nullptr);
  m.Finished(absl::DeadlineExceededError("late"), nullptr);
  m.Finished(absl::UnavailableError("gone"), nullptr);
  m.ttft.Observe(45);  // past the old 30 s cap
  std::string out;
  m.Render(ModelLabel("gpt-oss-20b"), out);
  const std::string model = "model_name=\"gpt-oss-20b\"";
  for (const char* reason : {"stop", "length", "cancelled", "deadline", "error"}) {
    EXPECT_TRUE(Has(out, "flotilla_requests_finished_total{" + model + ",finished_reason=\"" +
                             reason + "\"} 1\n"))
        << reason << "\n"
        << out;
  }
  // Each series: its name, its labels after the model's, its value.
  const std::vector<std::array<std::string, 3>> series = {
      {"flotilla_request_queue_time_seconds_bucket", ",le=\"1\"", "0"},
      {"flotilla_request_queue_time_seconds_bucket", ",le=\"2.5\"", "2"},
      {"flotilla_request_prefill_time_seconds_sum", "", "0.5"},
      {"flotilla_request_decode_time_seconds_bucket", ",le=\"1200\"", "2"},
      {"flotilla_request_decode_time_seconds_bucket", ",le=\"1800\"", "2"},
      {"flotilla_time_to_first_token_seconds_bucket", ",le=\"30\"", "0"},
      {"flotilla_time_to_first_token_seconds_bucket", ",le=\"60\"", "1"},
      {"flotilla_request_duration_seconds_bucket", ",le=\"1800\"", "0"},
      {"flotilla_prompt_tokens_total", "", "0"},
  };
  for (const auto& [name, labels, value] : series) {
    const std::string line = name + "{" + model + labels + "} " + value + "\n";
    EXPECT_TRUE(Has(out, line)) << line << out;
  }
}

TEST(ServingMetrics, LabelValuesAreEscaped) {
  EXPECT_EQ(ModelLabel("a\"b\\c\nd"), "model_name=\"a\\\"b\\\\c\\nd\"");
}

TEST(AccessRecord, TimeToFirstTokenIsTheFirstTokensArrival) {
  const absl::Time start = absl::FromUnixSeconds(1000);
  AccessRecord r("grpc Generate", start);
  r.AddOutputTokens(0, start + absl::Milliseconds(5));  // prompt logits only: no token yet
  EXPECT_FALSE(r.ttft().has_value());
  r.AddOutputTokens(2, start + absl::Milliseconds(40));
  r.AddOutputTokens(3, start + absl::Milliseconds(90));
  EXPECT_EQ(r.ttft(), absl::Milliseconds(40));
  EXPECT_EQ(r.output_tokens(), 5u);
  r.set_output_tokens(6);  // the worker's count (the end token included)
  EXPECT_EQ(r.output_tokens(), 6u);
  r.Log("OK", start + absl::Milliseconds(100));
  r.Log("OK", start + absl::Milliseconds(200));  // once only: no crash, no second line
}

}  // namespace
}  // namespace flotilla::coordinator
