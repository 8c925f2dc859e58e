#include "coordinator/grpc/generate_request.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace flotilla::coordinator {

absl::StatusOr<PreparedRequest> PrepareGenerate(const v1::GenerateRequest& request,
                                                const std::string& model_id,
                                                const tokenizer::Tokenizer& tok) {
  if (!request.model().empty() && request.model() != model_id) {
    return absl::NotFoundError(absl::StrCat(
        "model '", request.model(), "' is not served here; this server serves '", model_id, "'"));
  }
  if (request.n() > static_cast<uint32_t>(kMaxChoices)) {
    return absl::InvalidArgumentError(
        absl::StrCat("n: must be at most ", kMaxChoices, ", not ", request.n()));
  }
  PreparedRequest out;
  out.endpoint = Endpoint::kCompletions;
  out.n = std::max<uint32_t>(request.n(), 1);
  if (request.prompt_case() == v1::GenerateRequest::kPromptIds) {
    out.prompt.assign(request.prompt_ids().ids().begin(), request.prompt_ids().ids().end());
  } else if (request.prompt_case() == v1::GenerateRequest::kText) {
    absl::StatusOr<std::vector<tokenizer::TokenId>> ids =
        tok.Encode(request.text(), tokenizer::SpecialTokenPolicy::All());
    if (!ids.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("prompt text: ", ids.status().message()));
    }
    out.prompt = *std::move(ids);
  } else {
    return absl::InvalidArgumentError("the request has no prompt");
  }
  out.sampling = request.sampling();
  out.return_prompt_logits = request.return_prompt_logits();
  return out;
}

}  // namespace flotilla::coordinator
