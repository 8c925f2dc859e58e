// The OpenAI-compatible request/response pipeline, with no HTTP in it:
// request JSON -> validated sampling options and prompt tokens (chat requests
// go through the Harmony mapping and renderer), and generated tokens ->
// chat.completion(.chunk) / text_completion JSON (chat tokens go through the
// streaming Harmony parser). The HTTP server drives it; tests feed it recorded
// token sequences.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/grammar/output_constraint.h"
#include "coordinator/harmony/openai.h"
#include "coordinator/harmony/parser.h"
#include "coordinator/tokenizer/streaming_detokenizer.h"
#include "coordinator/tokenizer/tokenizer.h"
#include "common/grammar/output_constraint.h"
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

enum class Endpoint { kChat, kCompletions };

// A validated request, ready for ClusterManager::Submit.
struct PreparedRequest {
  Endpoint endpoint = Endpoint::kChat;
  std::vector<tokenizer::TokenId> prompt;
  common::SamplingParams sampling;
  std::vector<std::string> stop;  // stop strings
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool logprobs = false;
  int top_logprobs = 0;
  // Structured outputs (chat only): the constraint the worker decodes under.
  std::optional<grammar::ConstraintSpec> constraint;
};

// Chat completions: validates every field it uses (errors name the field),
// refuses a model other than `model_id` (NOT_FOUND), renders the Harmony
// prompt and stops on <|return|> and <|call|>. A rendered prompt of more than
// `max_prompt_text_bytes` (0 = no limit; see PromptTextByteLimit) is refused
// before it is tokenised.
absl::StatusOr<PreparedRequest> PrepareChatRequest(const Json& body, std::string_view model_id,
                                                   const tokenizer::Tokenizer& tok,
                                                   const harmony::OpenAiRequestOptions& options,
                                                   size_t max_prompt_text_bytes = 0);
// Completions: `prompt` is a string (or an array holding one string), refused
// untokenised when longer than `max_prompt_text_bytes` (0 = no limit).
absl::StatusOr<PreparedRequest> PrepareCompletionRequest(const Json& body,
                                                         std::string_view model_id,
                                                         const tokenizer::Tokenizer& tok,
                                                         size_t max_prompt_text_bytes = 0);
// Parses a request body: UTF-8, JSON, an object.
absl::StatusOr<Json> ParseBody(std::string_view body);

// Holds back text that may be the start of a stop string; reports a hit.
class StopFilter {
 public:
  explicit StopFilter(std::vector<std::string> stops) : stops_(std::move(stops)) {}
  // Returns the text that is safe to emit. After a hit, returns only the text
  // before the stop string and then nothing more.
  std::string Push(std::string_view text);
  // The held-back text (the stream ended without completing a stop string).
  std::string Flush();
  bool hit() const { return hit_; }

 private:
  std::vector<std::string> stops_;
  std::string pending_;
  bool hit_ = false;
};

// Builds the response of one request from its generated tokens.
class ResponseBuilder {
 public:
  // `tokenizer` must outlive the builder. `id` is the response id (also the
  // seed of tool call ids); `created` is unix seconds.
  ResponseBuilder(const tokenizer::Tokenizer* tokenizer, Endpoint endpoint, std::string id,
                  std::string model, int64_t created, std::vector<std::string> stop,
                  bool logprobs);

  // The first streamed chunk (chat: the assistant role); empty for completions.
  std::vector<Json> Begin();
  // Feeds generated tokens (with their logprobs when asked for); returns the
  // chunks to stream. Once a stop string was produced, further tokens are ignored.
  std::vector<Json> Feed(const std::vector<tokenizer::TokenId>& tokens,
                         const std::vector<common::TokenLogprob>& logprobs);
  // Feeds one SequenceUpdate (tokens and logprobs).
  std::vector<Json> FeedUpdate(const cluster::SequenceUpdate& update);
  // Ends generation: `reason` is the worker's finish reason, `stop_token` the
  // end token it stopped on (not part of the tokens). Returns the last chunks
  // (held-back text, then the finish_reason chunk).
  std::vector<Json> Finish(common::FinishReason reason, std::optional<tokenizer::TokenId> stop_token,
                           uint32_t prompt_tokens, uint32_t completion_tokens);

  // A stop string appeared: the caller should cancel the sequence.
  bool stopped_by_string() const { return filter_.hit(); }
  const std::string& finish_reason() const { return finish_reason_; }
  Json Usage() const;
  // The streamed usage chunk (choices empty).
  Json UsageChunk() const;
  // The whole non-streamed response.
  Json Response() const;

 private:
  Json Chunk(Json delta_or_text, const Json& logprobs, const Json& finish_reason) const;
  void Emit(Json delta, std::vector<Json>& out);
  void EmitText(const std::string& text, std::vector<Json>& out);
  Json LogprobsJson(const std::vector<common::TokenLogprob>& logprobs) const;
  void ProcessToken(tokenizer::TokenId token, std::vector<Json>& out);

  const tokenizer::Tokenizer* tok_;
  Endpoint endpoint_;
  std::string id_, model_;
  int64_t created_;
  bool logprobs_;
  StopFilter filter_;
  harmony::StreamParser parser_;
  harmony::ChatDeltaMapper mapper_;
  tokenizer::StreamingDetokenizer detok_;
  // The merged response.
  std::string content_, reasoning_;
  Json tool_calls_ = Json::array();
  Json logprob_items_ = Json::array();
  Json pending_logprobs_;  // attached to the next chunk
  std::string finish_reason_;
  uint32_t prompt_tokens_ = 0, completion_tokens_ = 0;
  bool finished_ = false;
};

}  // namespace flotilla::coordinator
