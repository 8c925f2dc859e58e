#include "worker/resume.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace flotilla::worker {

absl::Status CheckResume(const cluster::SubmitSequence& submit, const std::vector<int>& stop_ids,
                         int64_t max_tokens, int vocab_size) {
  if (!submit.has_resume()) return absl::OkStatus();
  if (submit.return_prompt_logits()) {
    return absl::InvalidArgumentError(
        "resume cannot be combined with return_prompt_logits: the prompt's logits were streamed "
        "before the request moved");
  }
  const auto& output = submit.resume().output_ids();
  for (int i = 0; i < output.size(); ++i) {
    const int32_t token = output[i];
    if (token < 0 || token >= vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("resume.output_ids[", i, "] = ", token,
                                                     " is outside [0, ", vocab_size, ")"));
    }
    if (std::find(stop_ids.begin(), stop_ids.end(), token) != stop_ids.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("resume.output_ids[", i, "] = ", token,
                       " is a stop token of this request, which ends it and is never streamed"));
    }
  }
  if (output.size() >= max_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("resume.output_ids holds ", output.size(),
                                                   " tokens but the request may have ", max_tokens,
                                                   " in all: nothing is left to generate"));
  }
  return absl::OkStatus();
}

absl::Status ReplayOutput(const std::vector<int32_t>& output, Sampler& sampler,
                          const ConstraintFilter* constraint) {
  for (size_t i = 0; i < output.size(); ++i) {
    sampler.Record(output[i]);
    if (constraint != nullptr && !constraint->status().ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "resume.output_ids[", i, "] = ", output[i],
          " is refused by the request's output constraint: ", constraint->status().message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace flotilla::worker
