// Builds a Responses API answer (POST /v1/responses) from the events of its
// RequestSession (request_events.h): each Harmony message the session
// reports (kMessageStart ... kMessageEnd) becomes an output item: reasoning
// -> a `reasoning` item (its text in a `reasoning_text` part), a function
// call -> a `function_call` item (the call id chat completions gives it),
// answer text (final, and commentary preambles) -> a `message` item with one
// `output_text` part. Built-in tool calls are not shown, as in chat.
//
// Streamed, the same items arrive as the Responses event sequence, each event
// with its sequence_number: response.created, response.in_progress, then per
// item output_item.added, content_part.added, *.delta..., *.done,
// content_part.done, output_item.done, and last response.completed (or
// response.incomplete when max_output_tokens cut it). The whole response is
// the object that last event carries. No HTTP and no decoding here: tests
// feed it the events of recorded tokens.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "coordinator/http/openai_pipeline.h"
#include "coordinator/http/responses_cipher.h"
#include "coordinator/request_events.h"

namespace flotilla::coordinator {

class ResponsesStream {
 public:
  // `id` is the response id (the session's call_id_seed must be the same, so
  // call ids match chat's; it also seeds the item ids); `settings` are the
  // request's fields the Response repeats (ResponseSettings); `created_at`
  // is unix seconds. With `seal`, each reasoning item also carries its text
  // sealed as `encrypted_content` (include: ["reasoning.encrypted_content"]).
  ResponsesStream(std::string id, std::string model, Json settings, int64_t created_at,
                  const ReasoningCipher* seal = nullptr);

  // response.created and response.in_progress.
  std::vector<Json> Begin();
  // The events of a batch of the session's events (one choice). kFinish
  // closes what is open (as incomplete when the length limit cut it); the
  // terminal kUsage ends the response: response.completed or
  // response.incomplete. kTokens and kError make none (ErrorEvent is the
  // caller's, which also answers a whole response's error).
  std::vector<Json> Consume(const std::vector<RequestEvent>& events);

  // The `error` event that ends a stream the generation failed under
  // (`code` and `param` empty: null), numbered after the events so far.
  Json ErrorEvent(const std::string& code, const std::string& message, const std::string& param);

  // Ends the response without a finish: `status` "cancelled" or "failed"
  // (then `error` is its {code, message}); the open item closes as
  // incomplete (its events are returned), and the output so far is the
  // response's. Nothing once the response ended.
  std::vector<Json> Abort(const char* status, Json error);

  bool finished() const { return finished_; }
  // The Response object: in progress until the end, then the whole answer.
  Json Response() const;
  // The output items so far (what a follow-up's previous_response_id continues).
  const Json& output() const { return output_; }

 private:
  enum class Kind { kNone, kReasoning, kMessage, kFunctionCall };
  void Handle(const RequestEvent& event, std::vector<Json>& out);
  // Opens an item of `kind` (kFunctionCall: for `call`, its first piece).
  void OpenItem(Kind kind, const ToolCallPiece& call, std::vector<Json>& out);
  void AppendDelta(const std::string& delta, std::vector<Json>& out);
  void CloseItem(const char* status, std::vector<Json>& out);
  void End(const TokenUsage& usage, std::vector<Json>& out);
  // The open item's item_id, output_index (and content_index) for its events.
  Json ItemFields() const;
  Json Event(const char* type, Json fields);
  Json& OpenItemJson() { return output_[output_.size() - 1]; }

  std::string id_, model_;
  Json settings_;
  int64_t created_at_;
  const ReasoningCipher* seal_;
  Json output_ = Json::array();
  Kind open_ = Kind::kNone;  // the kind of the last item of output_ while it is open
  std::string open_text_;    // the open item's text (or arguments) so far
  uint64_t sequence_ = 0;
  bool cut_ = false;  // the length limit ended the generation (kFinish)
  TokenUsage usage_;
  std::string status_ = "in_progress";
  Json incomplete_details_ = nullptr;
  Json error_ = nullptr;
  bool finished_ = false;
};

}  // namespace flotilla::coordinator
