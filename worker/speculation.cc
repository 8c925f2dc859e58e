#include "worker/speculation.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "worker/ngram_drafter.h"

namespace flotilla::worker {

absl::StatusOr<SpeculativeMethod> ParseSpeculativeMethod(std::string_view name) {
  if (name == "off") return SpeculativeMethod::kOff;
  if (name == "ngram") return SpeculativeMethod::kNgram;
  if (name == "eagle3" || name == "suffix") {
    return absl::InvalidArgumentError(
        absl::StrCat("speculative method \"", std::string(name),
                     "\" is not built yet; this worker knows ngram and off"));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown speculative method \"", std::string(name), "\"; known: ngram, off"));
}

std::string_view SpeculativeMethodName(SpeculativeMethod method) {
  return method == SpeculativeMethod::kNgram ? "ngram" : "off";
}

absl::Status ValidateSpeculative(const SpeculativeConfig& config) {
  if (config.num_tokens < 1 || config.num_tokens > kMaxSpeculativeTokens) {
    return absl::InvalidArgumentError(absl::StrCat("num_speculative_tokens must be in [1, ",
                                                   kMaxSpeculativeTokens, "], got ",
                                                   config.num_tokens));
  }
  if (config.lookup_min < 1 || config.lookup_max < config.lookup_min ||
      config.lookup_max > kMaxPromptLookup) {
    return absl::InvalidArgumentError(
        absl::StrCat("prompt_lookup_min and prompt_lookup_max must satisfy 1 <= min <= max <= ",
                     kMaxPromptLookup, ", got ", config.lookup_min, " and ", config.lookup_max));
  }
  return absl::OkStatus();
}

absl::Status SetSpeculativeMethod(std::string_view method, SpeculativeConfig* config) {
  absl::StatusOr<SpeculativeMethod> parsed = ParseSpeculativeMethod(method);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--speculative-method: ", parsed.status().message()));
  }
  config->method = *parsed;
  if (absl::Status st = ValidateSpeculative(*config); !st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--num-speculative-tokens: ", st.message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<SpeculativeConfig> SpeculativeFor(const common::SpeculativeParams& request,
                                                 const SpeculativeConfig& worker_default) {
  SpeculativeConfig config = worker_default;
  if (!request.method().empty()) {
    absl::StatusOr<SpeculativeMethod> method = ParseSpeculativeMethod(request.method());
    if (!method.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("speculative.method: ", method.status().message()));
    }
    config.method = *method;
  }
  if (request.num_speculative_tokens() != 0) {
    config.num_tokens = static_cast<int>(
        std::min<uint32_t>(request.num_speculative_tokens(), kMaxSpeculativeTokens + 1));
  }
  if (request.prompt_lookup_min() != 0) {
    config.lookup_min =
        static_cast<int>(std::min<uint32_t>(request.prompt_lookup_min(), kMaxPromptLookup + 1));
  }
  if (request.prompt_lookup_max() != 0) {
    config.lookup_max =
        static_cast<int>(std::min<uint32_t>(request.prompt_lookup_max(), kMaxPromptLookup + 1));
  }
  if (absl::Status st = ValidateSpeculative(config); !st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("speculative: ", st.message()));
  }
  return config;
}

std::vector<int32_t> DraftFor(const SpeculativeConfig& config, absl::Span<const int32_t> context,
                              int64_t limit) {
  const int k = static_cast<int>(std::min<int64_t>(config.num_tokens, limit));
  if (config.method == SpeculativeMethod::kOff || k <= 0) return {};
  return ProposeNgramDraft(context, config.lookup_min, config.lookup_max, k);
}

}  // namespace flotilla::worker
