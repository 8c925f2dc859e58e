// Speculative decoding's settings: the worker's default (--speculative-method,
// --num-speculative-tokens) and each request's choice over it
// (SamplingParams.speculative), and the draft a decode step brings.
// Verification is the engine's (StepItem::draft_tokens, VerifyDraft).
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
  kNgram,  // prompt lookup over the request's prompt and output (ngram_drafter.h)
};

// Most drafted tokens per step a request may ask for.
inline constexpr int kMaxSpeculativeTokens = 16;
// Longest n-gram prompt lookup may match.
inline constexpr int kMaxPromptLookup = 64;

struct SpeculativeConfig {
  SpeculativeMethod method = SpeculativeMethod::kOff;
  int num_tokens = 3;  // drafted tokens per step, [1, kMaxSpeculativeTokens]
  int lookup_min = 1;  // n-gram lengths prompt lookup matches
  int lookup_max = 4;
};

// "off" or "ngram"; INVALID_ARGUMENT naming the methods known (and saying
// which are not built yet) otherwise.
absl::StatusOr<SpeculativeMethod> ParseSpeculativeMethod(std::string_view name);
std::string_view SpeculativeMethodName(SpeculativeMethod method);

// INVALID_ARGUMENT naming the first field out of range.
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

// The draft for a sequence whose prompt and output so far are `context`: at
// most min(config.num_tokens, limit) tokens; empty when off or nothing matches.
std::vector<int32_t> DraftFor(const SpeculativeConfig& config, absl::Span<const int32_t> context,
                              int64_t limit);

}  // namespace flotilla::worker
