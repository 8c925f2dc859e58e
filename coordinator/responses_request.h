// POST /v1/responses requests (the OpenAI Responses API) on the chat
// pipeline: the request is validated with the Responses field names, its
// input items (after those of the response `previous_response_id` names)
// become a chat-completions body, and PrepareChatRequest renders that with
// Harmony exactly as it renders a chat request. Errors the chat pipeline finds
// are renamed to the Responses field they came from (`messages[3]` ->
// `input[1]`, `response_format.json_schema.schema` -> `text.format.schema`).
// No HTTP here: the HTTP driver and tests call it.
// The items become chat messages as responses_items.h says.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "coordinator/harmony/openai.h"
#include "coordinator/openai_pipeline.h"
#include "coordinator/tokenizer/tokenizer.h"

namespace flotilla::coordinator {

// A validated Responses request.
struct ResponsesRequest {
  Json body;                         // the request as received
  Json input_items = Json::array();  // `input` as items (a string: one user message)
  std::string previous_response_id;  // empty: none
  bool store = true;
  bool stream = false;
};

// Checks every field (unsupported ones are INVALID_ARGUMENT naming the field:
// built-in tools, background: true, include, truncation: "auto", ...).
absl::StatusOr<ResponsesRequest> ParseResponsesRequest(const Json& body);

// The chat-completions body for `request` continuing `history` (the stored
// items of previous_response_id; an empty array when there is none).
absl::StatusOr<Json> ResponsesToChatBody(const ResponsesRequest& request, const Json& history);

// ResponsesToChatBody + PrepareChatRequest, errors named as Responses fields.
absl::StatusOr<PreparedRequest> PrepareResponsesRequest(
    const ResponsesRequest& request, const Json& history, std::string_view model_id,
    const tokenizer::Tokenizer& tok, const harmony::OpenAiRequestOptions& options,
    size_t max_prompt_text_bytes = 0);

// The request's settings as the Response object repeats them (instructions,
// tools, tool_choice, reasoning, text, sampling, store, metadata, ...).
Json ResponseSettings(const ResponsesRequest& request);

}  // namespace flotilla::coordinator
