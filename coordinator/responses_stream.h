// Builds a Responses API answer (POST /v1/responses) from generated tokens:
// the tokens go through the streaming Harmony parser, and each assistant
// message becomes an output item: analysis -> a `reasoning` item (its text in
// a `reasoning_text` part), commentary to `functions.NAME` -> a
// `function_call` item (call_id as chat completions derives it), final and
// commentary preambles -> a `message` item with one `output_text` part.
// Built-in tool calls (no `functions.` recipient) are not shown, as in chat.
//
// Streamed, the same items arrive as the Responses event sequence, each event
// with its sequence_number: response.created, response.in_progress, then per
// item output_item.added, content_part.added, *.delta..., *.done,
// content_part.done, output_item.done, and last response.completed (or
// response.incomplete when max_output_tokens cut it). The whole response is
// the object that last event carries. No HTTP here; tests feed recorded tokens.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "coordinator/harmony/parser.h"
#include "coordinator/openai_pipeline.h"
#include "coordinator/tokenizer/tokenizer.h"
#include "proto/cluster.pb.h"
#include "proto/common.pb.h"

namespace flotilla::coordinator {

class ResponsesStream {
 public:
  // `tokenizer` must outlive the stream. `id` is the response id (and the
  // seed of item and call ids); `settings` are the request's fields the
  // Response repeats (ResponseSettings); `created_at` is unix seconds.
  ResponsesStream(const tokenizer::Tokenizer* tokenizer, std::string id, std::string model,
                  Json settings, int64_t created_at);

  // response.created and response.in_progress.
  std::vector<Json> Begin();
  // Feeds generated tokens; returns the events they produced.
  std::vector<Json> Feed(const std::vector<tokenizer::TokenId>& tokens);
  std::vector<Json> FeedUpdate(const cluster::SequenceUpdate& update);
  // Ends generation (`stop_token`: the end token the worker stopped on, not
  // among the tokens): closes what is open (as incomplete when the length
  // limit cut it) and returns the last events, response.completed or
  // response.incomplete last.
  std::vector<Json> Finish(common::FinishReason reason,
                           std::optional<tokenizer::TokenId> stop_token, uint32_t prompt_tokens,
                           uint32_t completion_tokens);

  // The `error` event that ends a stream the generation failed under
  // (`code` and `param` empty: null), numbered after the events so far.
  Json ErrorEvent(const std::string& code, const std::string& message, const std::string& param);

  bool finished() const { return finished_; }
  // The Response object: in progress until Finish, then the whole answer.
  Json Response() const;
  // The output items so far (what a follow-up's previous_response_id continues).
  const Json& output() const { return output_; }

 private:
  enum class Kind { kNone, kReasoning, kMessage, kFunctionCall };
  void ProcessToken(tokenizer::TokenId token, std::vector<Json>& out);
  void OpenItem(const harmony::Message& header, std::vector<Json>& out);
  void AppendDelta(const std::string& delta, std::vector<Json>& out);
  void CloseItem(const char* status, std::vector<Json>& out);
  // The open item's item_id, output_index (and content_index) for its events.
  Json ItemFields() const;
  Json Event(const char* type, Json fields);
  Json& OpenItemJson() { return output_[output_.size() - 1]; }

  const tokenizer::Tokenizer* tok_;
  std::string id_, model_;
  Json settings_;
  int64_t created_at_;
  harmony::StreamParser parser_;
  Json output_ = Json::array();
  Kind open_ = Kind::kNone;  // the kind of the last item of output_ while it is open
  std::string open_text_;    // the open item's text (or arguments) so far
  int function_calls_ = 0;
  uint64_t sequence_ = 0;
  uint32_t reasoning_tokens_ = 0;
  uint32_t prompt_tokens_ = 0, completion_tokens_ = 0;
  std::string status_ = "in_progress";
  Json incomplete_details_ = nullptr;
  bool finished_ = false;
};

}  // namespace flotilla::coordinator
