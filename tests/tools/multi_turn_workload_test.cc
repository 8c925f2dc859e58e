#include "tools/cli/multi_turn_workload.h"

#include <gtest/gtest.h>

namespace flotilla::cli {
namespace {

std::vector<int32_t> Output(int n, int32_t base) {
  std::vector<int32_t> out(n);
  for (int i = 0; i < n; ++i) out[i] = base + i;
  return out;
}

TEST(MultiTurnConversation, EachTurnRepeatsThePreviousPromptAndOutputThenAddsTurnTokens) {
  MultiTurnConversation c({/*turns=*/3, /*turn_tokens=*/64, /*first_prompt_min=*/100,
                           /*first_prompt_max=*/100, /*vocab=*/1000});
  std::mt19937_64 rng(7);
  const std::vector<int32_t> turn1 = c.Next(rng);
  EXPECT_EQ(c.turn(), 1);
  EXPECT_EQ(c.shared_tokens(), 0);
  ASSERT_EQ(turn1.size(), 100u);
  for (int32_t t : turn1) {
    EXPECT_GE(t, 0);
    EXPECT_LT(t, 1000);
  }
  const std::vector<int32_t> out1 = Output(10, 5000);
  c.Done(out1, true);

  const std::vector<int32_t> turn2 = c.Next(rng);
  EXPECT_EQ(c.turn(), 2);
  EXPECT_EQ(c.shared_tokens(), 110);
  ASSERT_EQ(turn2.size(), 100u + 10u + 64u);
  EXPECT_TRUE(std::equal(turn1.begin(), turn1.end(), turn2.begin()));
  EXPECT_TRUE(std::equal(out1.begin(), out1.end(), turn2.begin() + 100));
  const std::vector<int32_t> out2 = Output(7, 6000);
  c.Done(out2, true);

  const std::vector<int32_t> turn3 = c.Next(rng);
  EXPECT_EQ(c.turn(), 3);
  EXPECT_EQ(c.shared_tokens(), static_cast<int64_t>(turn2.size() + out2.size()));
  ASSERT_EQ(turn3.size(), turn2.size() + out2.size() + 64);
  EXPECT_TRUE(std::equal(turn2.begin(), turn2.end(), turn3.begin()));
  EXPECT_TRUE(std::equal(out2.begin(), out2.end(), turn3.begin() + turn2.size()));
  c.Done(Output(3, 7000), true);

  // After the last turn, a new conversation: a fresh prompt of turn 1's length.
  const std::vector<int32_t> next = c.Next(rng);
  EXPECT_EQ(c.turn(), 1);
  EXPECT_EQ(c.shared_tokens(), 0);
  ASSERT_EQ(next.size(), 100u);
  EXPECT_NE(next, turn1);
}

TEST(MultiTurnConversation, AFailedTurnStartsANewConversation) {
  MultiTurnConversation c({4, 8, 5, 9, 50});
  std::mt19937_64 rng(1);
  c.Next(rng);
  c.Done(Output(2, 100), true);
  c.Next(rng);
  EXPECT_EQ(c.turn(), 2);
  c.Done({}, false);
  const std::vector<int32_t> fresh = c.Next(rng);
  EXPECT_EQ(c.turn(), 1);
  EXPECT_GE(fresh.size(), 5u);
  EXPECT_LE(fresh.size(), 9u);
}

TEST(MultiTurnConversation, OneTurnIsIndependentPrompts) {
  MultiTurnConversation c({1, 64, 20, 20, 100});
  std::mt19937_64 rng(3);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(c.Next(rng).size(), 20u);
    EXPECT_EQ(c.turn(), 1);
    c.Done(Output(5, 0), true);
  }
}

TEST(PrometheusValue, ReadsACounterAndSumsItsSeries) {
  const std::string text =
      "# HELP flotilla_prefix_cache_hits_tokens_total prompt tokens found\n"
      "# TYPE flotilla_prefix_cache_hits_tokens_total counter\n"
      "flotilla_prefix_cache_hits_tokens_total 1234\n"
      "flotilla_prefix_cache_hits_tokens_total_other 9\n"
      "flotilla_worker_kv_cache_usage_ratio{worker=\"w0\",rank=\"0\"} 0.25\n"
      "flotilla_worker_kv_cache_usage_ratio{worker=\"w1\",rank=\"1\"} 0.5\n";
  EXPECT_EQ(PrometheusValue(text, "flotilla_prefix_cache_hits_tokens_total"), 1234.0);
  EXPECT_EQ(PrometheusValue(text, "flotilla_worker_kv_cache_usage_ratio"), 0.75);
  EXPECT_FALSE(PrometheusValue(text, "flotilla_prefix_cache_queries_tokens_total").has_value());
}

TEST(PrometheusValues, ReadsTheNamedCountersInOrderAndNamesTheFirstMissing) {
  const std::string text =
      "flotilla_a_total 3\n"
      "flotilla_b_total{worker=\"w0\"} 1\n"
      "flotilla_b_total{worker=\"w1\"} 2\n";
  absl::StatusOr<std::vector<double>> v =
      PrometheusValues(text, "http://h:1/metrics", {"flotilla_b_total", "flotilla_a_total"},
                       {"flotilla_absent_total", "flotilla_a_total"});
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, (std::vector<double>{3.0, 3.0, 0.0, 3.0}));

  absl::StatusOr<std::vector<double>> missing = PrometheusValues(
      text, "http://h:1/metrics", {"flotilla_a_total", "flotilla_c_total", "flotilla_d_total"});
  ASSERT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(missing.status().message(), "http://h:1/metrics has no flotilla_c_total");
}

TEST(HttpGetMetrics, RefusesAUrlThatIsNotHttp) {
  EXPECT_FALSE(HttpGetMetrics("https://127.0.0.1:1/metrics").ok());
  EXPECT_FALSE(HttpGetMetrics("127.0.0.1:1/metrics").ok());
  EXPECT_FALSE(HttpGetMetrics("http:///metrics").ok());
}

}  // namespace
}  // namespace flotilla::cli
