#include "coordinator/cluster/request_check.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/sampling_check.h"
#include "common/status.h"
#include "coordinator/input_limits.h"

namespace flotilla::coordinator {

absl::Status CheckSubmission(cluster::SubmitSequence& request, const ClusterOptions& options) {
  if (request.prompt_ids().empty()) return absl::InvalidArgumentError("the prompt is empty");
  for (int id : request.prompt_ids()) {
    if (id < 0 || id >= options.model.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("prompt token id ", id,
                                                     " is outside the vocabulary [0, ",
                                                     options.model.vocab_size, ")"));
    }
  }
  FLOTILLA_RETURN_IF_ERROR(CheckSamplingParams(request.sampling(), options.model.vocab_size));
  if (request.has_resume()) {
    return absl::InvalidArgumentError(
        "resume is set by the coordinator when it moves a request between instances; a client "
        "cannot send it");
  }
  const int64_t context =
      options.max_model_len > 0
          ? std::min<int64_t>(options.max_model_len, options.model.max_position_embeddings)
          : options.model.max_position_embeddings;
  // Prompt + max_tokens within the context, or a clear refusal (cut to fit
  // when the request asked to be truncated).
  FLOTILLA_RETURN_IF_ERROR(FitToContext(request, context));
  if (request.return_prompt_logits()) {
    const uint64_t bytes = static_cast<uint64_t>(request.prompt_ids_size()) *
                           static_cast<uint64_t>(options.model.vocab_size) * sizeof(float);
    if (bytes > options.max_prompt_logits_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "return_prompt_logits for ", request.prompt_ids_size(), " prompt tokens is ",
          bytes >> 20, " MiB of logits, over this server's limit of ",
          options.max_prompt_logits_bytes >> 20, " MiB; shorten the prompt"));
    }
  }
  return absl::OkStatus();
}

}  // namespace flotilla::coordinator
