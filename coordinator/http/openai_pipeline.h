// The OpenAI-compatible request/response pipeline, with no HTTP in it:
// request JSON -> the typed request (prepared_request.h: validated sampling
// options and prompt tokens; chat requests go through the Harmony mapping
// and renderer), and generated tokens -> chat.completion(.chunk) /
// text_completion JSON (chat tokens go through the streaming Harmony
// parser). The HTTP server drives it; tests feed it recorded token sequences.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/grammar/output_constraint.h"
#include "common/harmony/openai.h"
#include "common/harmony/parser.h"
#include "common/tokenizer/streaming_detokenizer.h"
#include "common/tokenizer/tokenizer.h"
#include "coordinator/choice_decoder.h"
#include "coordinator/http/request_fields.h"
#include "coordinator/prepared_request.h"
#include "coordinator/request_events.h"
#include "coordinator/stop_filter.h"
#include "proto/cluster.pb.h"
#include "proto/common.pb.h"

namespace flotilla::coordinator {

using Json = nlohmann::ordered_json;

// An error as the client sees it: HTTP status plus the OpenAI error fields.
struct ApiError {
  int http_status = 500;
  std::string message;
  std::string type;   // invalid_request_error, rate_limit_error, ...
  std::string param;  // the offending field, or empty
  std::string code;   // e.g. model_not_found; empty: null
};
// 400 INVALID_ARGUMENT / OUT_OF_RANGE, 404 NOT_FOUND, 429 RESOURCE_EXHAUSTED,
// 503 UNAVAILABLE, 504 DEADLINE_EXCEEDED, 500 otherwise. A message of the form
// "field.path: what" names its field in `param`.
ApiError ErrorFromStatus(const absl::Status& status);
// {"error": {"message", "type", "param", "code"}}
Json ErrorJson(const ApiError& error);
// Serializes JSON for the wire; strings that are not UTF-8 are repaired, never thrown on.
std::string DumpJson(const Json& j);

// The member of a chat message and delta that carries reasoning text
// (--reasoning-field): vLLM's current `reasoning`, its older
// `reasoning_content`, or both (the default: clients read either).
enum class ReasoningField { kReasoning, kReasoningContent, kBoth };
// "reasoning", "reasoning_content" or "both"; INVALID_ARGUMENT otherwise.
absl::StatusOr<ReasoningField> ParseReasoningField(std::string_view name);

// Chat completions: validates every field it uses (errors name the field),
// refuses a model other than `model_id` (NOT_FOUND), renders the Harmony
// prompt and stops on <|return|> and <|call|> (and the request's
// stop_token_ids). A rendered prompt of more than `max_prompt_text_bytes`
// (0 = no limit; see PromptTextByteLimit) is refused before it is tokenised.
// Fields it does not know are noted in `ignored_fields`, or refused under
// UnknownFields::kRefuse (request_fields.h).
absl::StatusOr<PreparedRequest> PrepareChatRequest(
    const Json& body, std::string_view model_id, const tokenizer::Tokenizer& tok,
    const harmony::OpenAiRequestOptions& options, size_t max_prompt_text_bytes = 0,
    UnknownFields unknown_fields = UnknownFields::kIgnore);
// Completions: `prompt` is a string, an array of strings, an array of token
// ids or an array of arrays of token ids (ids checked against the
// vocabulary; at most kMaxBatchPrompts prompts); a text is refused
// untokenised when longer than `max_prompt_text_bytes` (0 = no limit).
// Unknown fields as for chat.
absl::StatusOr<PreparedRequest> PrepareCompletionRequest(
    const Json& body, std::string_view model_id, const tokenizer::Tokenizer& tok,
    size_t max_prompt_text_bytes = 0, UnknownFields unknown_fields = UnknownFields::kIgnore);
// The pieces of a request every generating API reads under the same names
// (chat completions, completions, Responses); errors name the field.
// cache_salt, prompt_cache_key (the routing key), temperature, top_p, the
// penalties, top_k, min_p, repetition_penalty, logit_bias and seed.
absl::Status ReadSamplingFields(const Json& body, PreparedRequest& out);
// The output limit under `key` (max_tokens, max_completion_tokens,
// max_output_tokens): an integer of at least 1. False when absent.
absl::StatusOr<bool> ReadMaxTokens(const Json& body, const char* key, PreparedRequest& out);
// A Harmony reply's end: <|return|> and <|call|>, then the request's
// stop_token_ids and min_tokens.
absl::Status ReadChatEndTokens(const Json& body, int vocab_size, PreparedRequest& out);

// Parses a request body: UTF-8, JSON, an object.
absl::StatusOr<Json> ParseBody(std::string_view body);

// Turns the events of one request (request_events.h) into OpenAI JSON:
// chat.completion.chunk / text_completion chunks to stream, and the whole
// response with every choice. Feed/Finish decode one choice's tokens
// themselves (choice 0, through a ChoiceDecoder): for tests and one-choice callers.
class ResponseBuilder {
 public:
  // `tokenizer` must outlive the builder. `id` is the response id (also the
  // seed of choice 0's tool call ids); `created` is unix seconds; `choices`
  // the number of choices (prompts x n).
  ResponseBuilder(const tokenizer::Tokenizer* tokenizer, Endpoint endpoint, std::string id,
                  std::string model, int64_t created, std::vector<std::string> stop, bool logprobs,
                  uint32_t choices = 1);

  // The first streamed chunks (chat: the assistant role of each choice);
  // empty for completions.
  std::vector<Json> Begin();
  // The chunks of a batch of events (those of one worker update). A choice's
  // logprobs go with its next chunk (an empty one when its tokens made no text).
  std::vector<Json> Consume(const std::vector<RequestEvent>& events);

  // Where reasoning text goes (default: both members).
  void set_reasoning_field(ReasoningField field) { reasoning_field_ = field; }
  // For a stream, whose chunks carry everything: Response() is never asked
  // for, so the per-token logprobs it would list are not kept (a long answer
  // with top logprobs would otherwise hold kilobytes a token until it ends).
  void set_streaming(bool streaming) { streaming_ = streaming; }

  // Feeds generated tokens of choice 0 (with their logprobs when asked for);
  // returns the chunks to stream. Once a stop string was produced, further
  // tokens are ignored.
  std::vector<Json> Feed(const std::vector<tokenizer::TokenId>& tokens,
                         const std::vector<common::TokenLogprob>& logprobs);
  // Feeds one SequenceUpdate (tokens and logprobs) of choice 0.
  std::vector<Json> FeedUpdate(const cluster::SequenceUpdate& update);
  // Ends choice 0: `reason` is the worker's finish reason, `stop_token` the
  // end token it stopped on (not part of the tokens). Returns the last chunks
  // (held-back text, then the finish_reason chunk).
  std::vector<Json> Finish(common::FinishReason reason,
                           std::optional<tokenizer::TokenId> stop_token, uint32_t prompt_tokens,
                           uint32_t completion_tokens);

  // A stop string appeared in choice 0 (Feed): the caller should cancel the sequence.
  bool stopped_by_string() const { return decoder_.stopped_by_string(); }
  // Choice 0's finish reason.
  const std::string& finish_reason() const { return choices_[0].finish_reason; }
  Json Usage() const;
  // The streamed usage chunk (choices empty).
  Json UsageChunk() const;
  // The whole non-streamed response.
  Json Response() const;

 private:
  // What one choice produced, merged.
  struct Choice {
    std::string content, reasoning;
    Json tool_calls = Json::array();
    Json logprob_items;     // chat: an array of items; completions: the four lists
    Json pending_logprobs;  // attached to the choice's next chunk
    std::string finish_reason;
  };
  Json Chunk(uint32_t choice, Json delta_or_text, const Json& logprobs,
             const Json& finish_reason) const;
  void Emit(uint32_t choice, Json delta, std::vector<Json>& out);
  void AddLogprobs(uint32_t choice, const cluster::SequenceUpdate& update);
  void AddToolCall(const RequestEvent& event, std::vector<Json>& out);
  void FlushLogprobs(uint32_t choice, std::vector<Json>& out);
  Json LogprobsJson(const std::vector<common::TokenLogprob>& logprobs) const;
  Json ChoiceJson(uint32_t index) const;
  // `text` under the member(s) reasoning_field_ names.
  void PutReasoning(Json& message, const std::string& text) const;

  const tokenizer::Tokenizer* tok_;
  Endpoint endpoint_;
  std::string id_, model_;
  int64_t created_;
  bool logprobs_;
  ReasoningField reasoning_field_ = ReasoningField::kBoth;
  bool streaming_ = false;
  ChoiceDecoder decoder_;  // Feed/Finish only
  std::vector<Choice> choices_;
  TokenUsage usage_;
};

}  // namespace flotilla::coordinator
