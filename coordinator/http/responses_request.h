// POST /v1/responses requests (the OpenAI Responses API): the request is
// validated with the Responses field names, and its instructions, tools,
// tool_choice, reasoning, text.format and input items (after those of the
// response `previous_response_id` names) become the typed conversation
// (common/harmony/chat_request.h) that PrepareChatPrompt renders with Harmony
// exactly as it renders a chat request. Every part keeps the Responses field
// it came from, so errors name `input[1].call_id` or `text.format.schema`.
// No HTTP here: the HTTP driver and tests call it.
// The items become messages as responses_items.h says.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/harmony/openai.h"
#include "common/tokenizer/tokenizer.h"
#include "coordinator/http/openai_pipeline.h"
#include "coordinator/http/responses_cipher.h"

namespace flotilla::coordinator {

// A validated Responses request.
struct ResponsesRequest {
  Json body;                         // the request as received
  Json input_items = Json::array();  // `input` as items (a string: one user message)
  std::string previous_response_id;  // empty: none
  bool store = true;
  bool stream = false;
  // background: true: the request answers at once; GET polls the result.
  bool background = false;
  // include: ["reasoning.encrypted_content"]: reasoning items carry their
  // text sealed with `cipher`.
  bool encrypted_reasoning = false;
  // Opens input items' encrypted_content (and seals with encrypted_reasoning);
  // null: such items are refused.
  const ReasoningCipher* cipher = nullptr;
  // What happens to fields this server does not know (request_fields.h),
  // and the names of those ignored (the chat pipeline adds
  // chat_template_kwargs' members to PreparedRequest::ignored_fields).
  UnknownFields unknown_fields = UnknownFields::kIgnore;
  std::vector<std::string> ignored_fields;
};

// Checks every field (values asking for what this server cannot do are
// INVALID_ARGUMENT naming the field: built-in tools, include values other
// than reasoning.encrypted_content, background without store, truncation:
// "auto", conversation, prompt, ...); fields it does not know are ignored
// (noted in ignored_fields) or, with UnknownFields::kRefuse, refused by name.
// `cipher` opens the encrypted_content of reasoning items in `input`.
absl::StatusOr<ResponsesRequest> ParseResponsesRequest(
    const Json& body, const ReasoningCipher* cipher = nullptr,
    UnknownFields unknown_fields = UnknownFields::kIgnore);

// The prepared request for `request` continuing `history` (the stored items
// of previous_response_id; an empty array when there is none): sampling,
// max_output_tokens, the Harmony prompt and the structured-output
// constraint, errors naming Responses fields.
absl::StatusOr<PreparedRequest> PrepareResponsesRequest(
    const ResponsesRequest& request, const Json& history, std::string_view model_id,
    const tokenizer::Tokenizer& tok, const harmony::OpenAiRequestOptions& options,
    size_t max_prompt_text_bytes = 0);

// The request's settings as the Response object repeats them (instructions,
// tools, tool_choice, reasoning, text, sampling, store, metadata, ...).
Json ResponseSettings(const ResponsesRequest& request);

}  // namespace flotilla::coordinator
