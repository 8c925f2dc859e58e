// flotilla.v1.GenerateRequest -> the typed request (prepared_request.h): the
// prompt as token ids or text (encoded with every special token allowed),
// n choices, the sampling fields as given, prompt logits on request. No gRPC
// in here.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "common/tokenizer/tokenizer.h"
#include "coordinator/prepared_request.h"
#include "proto/flotilla.pb.h"

namespace flotilla::coordinator {

// NOT_FOUND for a model other than `model_id` (an empty model is this one);
// INVALID_ARGUMENT naming the field for n above kMaxChoices, a text that does
// not encode, or no prompt. The sampling fields are checked where every
// request's are (ClusterManager::Submit).
absl::StatusOr<PreparedRequest> PrepareGenerate(const v1::GenerateRequest& request,
                                                const std::string& model_id,
                                                const tokenizer::Tokenizer& tok);

}  // namespace flotilla::coordinator
