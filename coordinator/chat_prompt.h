// The chat part of a PreparedRequest, whichever API the request came in by:
// its typed conversation (common/harmony/chat_request.h) becomes the
// structured-output constraint and the rendered, tokenised Harmony prompt.
// The OpenAI chat JSON (http/openai_pipeline.h), Responses JSON
// (http/responses_request.h) and the flotilla.v1 ChatRequest
// (grpc/chat_request.h) parsers end here.
#pragma once

#include <cstddef>

#include "absl/status/status.h"
#include "common/harmony/chat_request.h"
#include "common/harmony/openai.h"
#include "common/tokenizer/tokenizer.h"
#include "coordinator/prepared_request.h"

namespace flotilla::coordinator {

// Sets `out.constraint` (reading `out.sampling.max_tokens()`) and
// `out.prompt`. A rendered prompt of more than `max_prompt_text_bytes`
// (0 = no limit) is refused, naming the conversation's messages field, before
// it is tokenised.
// Errors name the fields the conversation says its parts came from.
absl::Status PrepareChatPrompt(const harmony::ChatConversation& conversation,
                               const harmony::OpenAiRequestOptions& options,
                               const tokenizer::Tokenizer& tok, size_t max_prompt_text_bytes,
                               PreparedRequest& out);

}  // namespace flotilla::coordinator
