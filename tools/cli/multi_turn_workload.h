// `flotilla bench serve --multi-turn N`: conversations whose every turn
// repeats the previous turn (its prompt and its output) and adds new tokens,
// so the workers' prefix cache can serve the repeated part; and the
// coordinator's prefix-cache counters, read from its Prometheus /metrics.
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "tools/cli/prompt_stream.h"

namespace flotilla::cli {

struct MultiTurnOptions {
  int turns = 2;                                      // turns per conversation
  int turn_tokens = 64;                               // new tokens each turn after the first adds
  int first_prompt_min = 16, first_prompt_max = 128;  // turn 1's prompt length (uniform)
  int vocab = 1;                                      // token ids are drawn from [0, vocab)
};

// One stream's conversations, one turn at a time: Next() gives the prompt of
// the next request, Done() takes what it generated. Turn 1 is a fresh random
// prompt; turn k+1 is turn k's prompt + turn k's output + turn_tokens random
// ids; after `turns` turns, or after a failed turn, a new conversation starts.
// Its turns (1..turns) share with the previous turn its prompt and output (0
// tokens on turn 1); a failed turn ends the conversation.
class MultiTurnConversation : public GrowingConversation {
 public:
  explicit MultiTurnConversation(const MultiTurnOptions& options);

  const std::vector<int32_t>& Next(std::mt19937_64& rng) override;

 private:
  MultiTurnOptions options_;
};

// The value of a Prometheus counter or gauge in text exposition format,
// summed over its series (every label set); nullopt when absent.
std::optional<double> PrometheusValue(std::string_view text, std::string_view name);

// GET of an http://HOST:PORT[/PATH] URL (PATH defaults to /metrics): the body
// of a 200 answer.
absl::StatusOr<std::string> HttpGetMetrics(const std::string& url, const std::string& api_key = "");

// The values (PrometheusValue) of the counters `required`, then of
// `optional`, in the order named, from the exposition `text` read from
// `source`: NOT_FOUND naming `source` and the first required counter absent;
// an absent optional counter is 0.
absl::StatusOr<std::vector<double>> PrometheusValues(
    std::string_view text, std::string_view source, absl::Span<const std::string_view> required,
    absl::Span<const std::string_view> optional = {});

// PrometheusValues of the metrics HttpGetMetrics reads from `url`.
absl::StatusOr<std::vector<double>> ReadPrometheusValues(
    const std::string& url, const std::string& api_key, absl::Span<const std::string_view> required,
    absl::Span<const std::string_view> optional = {});

}  // namespace flotilla::cli
