// The flotilla.v1 ChatRequest parsed into the typed request
// (prepared_request.h) directly: its messages, tools, tool_choice,
// reasoning_effort and response_format become the typed conversation
// (common/harmony/chat_request.h) that chat_prompt.h renders, as the OpenAI
// chat JSON's do; no JSON body in between. Every error names the proto's
// field ("messages[1].tool_call_id", "tools[0].parameters_json",
// "sampling.temperature", "response_format.json_schema.schema_json").
#pragma once

#include <cstddef>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/harmony/chat_request.h"
#include "common/harmony/openai.h"
#include "common/tokenizer/tokenizer.h"
#include "coordinator/prepared_request.h"
#include "proto/flotilla.pb.h"

namespace flotilla::coordinator {

// The request's conversation. INVALID_ARGUMENT naming the field for what
// the proto can hold but a chat cannot (no role, reasoning or tool calls on
// a message that is not ASSISTANT's, a TOOL message without tool_call_id, a
// schema that is not JSON, an unknown enum value...).
absl::StatusOr<harmony::ChatConversation> ChatConversationOf(const v1::ChatRequest& request);

// The whole request: the sampling fields checked (ignore_eos refused: a
// chat reply ends at Harmony's end tokens, which come first in
// stop_token_ids), stop strings, n, the conversation rendered with Harmony.
// NOT_FOUND for a model other than `model_id` (empty: the served one). A
// rendered prompt of more than `max_prompt_text_bytes` (0 = no limit) is
// refused before it is tokenised.
absl::StatusOr<PreparedRequest> PrepareChat(const v1::ChatRequest& request,
                                            std::string_view model_id,
                                            const tokenizer::Tokenizer& tok,
                                            const harmony::OpenAiRequestOptions& options,
                                            size_t max_prompt_text_bytes = 0);

}  // namespace flotilla::coordinator
