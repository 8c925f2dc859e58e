// Speculative decoding's settings: the worker's default (--speculative-method,
// --num-speculative-tokens, --replay-error-rate, --allow-replay-drafter) and
// each request's choice over it (SamplingParams.speculative). The drafts are
// SpeculativeDrafter's (speculative_drafter.h); verification is the
// engine's (StepItem::draft_tokens, VerifyDraft).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "proto/common.pb.h"

namespace flotilla::worker {

enum class SpeculativeMethod {
  kOff,
  kNgram,   // prompt lookup over the request's prompt and output (ngram_drafter.h)
  kSuffix,  // suffix matching over the request and recent outputs (suffix_drafter.h)
  // Benchmarks only (refused unless allow_replay): the output an earlier
  // identical request produced, with chosen errors (replay_drafter.h).
  kReplay,
  // An EAGLE3 draft head over the target's hidden states (eagle3_drafter.h);
  // needs the worker's head (--speculative-model).
  kEagle3,
};

// Most drafted tokens per step a request may ask for.
inline constexpr int kMaxSpeculativeTokens = 16;
// Longest n-gram prompt lookup may match.
inline constexpr int kMaxPromptLookup = 64;
// --speculative-max-batch's default: steps with more decoding sequences draft
// nothing. Provisional (not yet measured on this engine): peers report
// weight-free drafting losing throughput above about 20 concurrent requests;
// worker/README.md "Speculative decoding" gives the bench that measures the
// crossing point.
inline constexpr int64_t kDefaultSpeculativeMaxBatch = 32;

struct SpeculativeConfig {
  SpeculativeMethod method = SpeculativeMethod::kOff;
  int num_tokens = 3;  // drafted tokens per step, [1, kMaxSpeculativeTokens]
  int lookup_min = 1;  // n-gram lengths prompt lookup matches
  int lookup_max = 4;
  // replay: the probability that each drafted token is replaced by another,
  // in [0, 1] (ExpectedReplayAcceptanceLength relates it to acceptance).
  double replay_error_rate = 0.0;
  // Whether the replay method may be chosen (--allow-replay-drafter): a
  // benchmark's opt-in, never set in production.
  bool allow_replay = false;
};

// "off", "ngram", "suffix", "replay" or "eagle3"; INVALID_ARGUMENT naming
// the methods known otherwise.
absl::StatusOr<SpeculativeMethod> ParseSpeculativeMethod(std::string_view name);
std::string_view SpeculativeMethodName(SpeculativeMethod method);

// INVALID_ARGUMENT naming the first field out of range, or the replay
// method without allow_replay.
absl::Status ValidateSpeculative(const SpeculativeConfig& config);

// The worker's flags: `method` parsed into `config`, then the whole checked
// (INVALID_ARGUMENT naming the flag).
absl::Status SetSpeculativeMethod(std::string_view method, SpeculativeConfig* config);

// A request's settings: the fields it sets over `worker_default` (an unset
// method keeps the worker's; a request naming a method takes the default
// token count and lookup lengths unless it sets them). INVALID_ARGUMENT
// naming the field ("speculative.method", ...) that is wrong.
absl::StatusOr<SpeculativeConfig> SpeculativeFor(const common::SpeculativeParams& request,
                                                 const SpeculativeConfig& worker_default);

}  // namespace flotilla::worker
