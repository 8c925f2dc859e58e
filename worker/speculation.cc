#include "worker/speculation.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace flotilla::worker {

absl::StatusOr<SpeculativeMethod> ParseSpeculativeMethod(std::string_view name) {
  if (name == "off") return SpeculativeMethod::kOff;
  if (name == "ngram") return SpeculativeMethod::kNgram;
  if (name == "suffix") return SpeculativeMethod::kSuffix;
  if (name == "replay") return SpeculativeMethod::kReplay;
  if (name == "eagle3") return SpeculativeMethod::kEagle3;
  return absl::InvalidArgumentError(absl::StrCat("unknown speculative method \"", std::string(name),
                                                 "\"; known: ngram, suffix, eagle3, replay, off"));
}

std::string_view SpeculativeMethodName(SpeculativeMethod method) {
  switch (method) {
    case SpeculativeMethod::kNgram:
      return "ngram";
    case SpeculativeMethod::kSuffix:
      return "suffix";
    case SpeculativeMethod::kReplay:
      return "replay";
    case SpeculativeMethod::kEagle3:
      return "eagle3";
    case SpeculativeMethod::kOff:
      break;
  }
  return "off";
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
  if (!(config.replay_error_rate >= 0.0 && config.replay_error_rate <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("replay_error_rate must be in [0, 1], got ", config.replay_error_rate));
  }
  if (config.method == SpeculativeMethod::kReplay && !config.allow_replay) {
    return absl::InvalidArgumentError(
        "speculative method \"replay\" drafts recorded outputs and is for benchmarks only; "
        "start the coordinator (or flotilla up) or the worker with --allow-replay-drafter");
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
    return absl::InvalidArgumentError(
        absl::StrCat("--speculative-method ", std::string(method), ": ", st.message()));
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
  if (request.has_replay_error_rate()) config.replay_error_rate = request.replay_error_rate();
  if (request.prompt_lookup_max() != 0) {
    config.lookup_max =
        static_cast<int>(std::min<uint32_t>(request.prompt_lookup_max(), kMaxPromptLookup + 1));
  }
  if (absl::Status st = ValidateSpeculative(config); !st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("speculative: ", st.message()));
  }
  return config;
}

}  // namespace flotilla::worker
