// The gRPC Chat call's replies (flotilla.v1.ChatResponse): the generated
// tokens go through the decoding the OpenAI chat completions use (streaming
// Harmony parser, stop strings, in ChoiceDecoder) whose events become
// ChatResponse deltas: reasoning, answer text and tool-call pieces on
// separate channels. The request is parsed by grpc/chat_request.h (included
// here for the service). No gRPC in here; the service drives it and tests
// feed it recorded token sequences.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/harmony/openai.h"
#include "common/tokenizer/tokenizer.h"
#include "coordinator/choice_decoder.h"
#include "coordinator/grpc/chat_request.h"
#include "coordinator/request_events.h"
#include "proto/cluster.pb.h"
#include "proto/flotilla.pb.h"

namespace flotilla::coordinator {

// Builds the ChatResponse stream of one request: from RequestSession events
// (Consume) or, decoding them itself, from its SequenceUpdates (Feed).
class ChatStream {
 public:
  // `tokenizer` must outlive the stream. `request_id` goes on every message;
  // `call_id_seed` seeds the tool call ids (unique per request).
  // `return_token_ids`: every update's tokens go into token_ids too.
  // `choices`: the request's n (messages carry their choice in `index`).
  ChatStream(const tokenizer::Tokenizer* tokenizer, std::string request_id,
             std::string call_id_seed, std::vector<std::string> stop, uint32_t prompt_tokens,
             bool return_token_ids = false, uint32_t choices = 1);

  // The first message: the request id alone (usable with Cancel at once).
  v1::ChatResponse Begin() const;
  // The messages of a batch of RequestSession events: one per choice that
  // got anything, naming it in `index`; a choice's kFinish makes its message
  // its last (finish reason and usage). The terminal events are the caller's
  // to serialize.
  std::vector<v1::ChatResponse> Consume(const std::vector<RequestEvent>& events);
  // Decodes one update itself (without a RequestSession); returns the message to send, if the update produced
  // anything. The update with a finish reason (or a stop string in the
  // answer) gives the last message: finish reason and usage. Updates that
  // carry an error (finish reason ERROR) and updates after the end give nothing.
  std::optional<v1::ChatResponse> Feed(const cluster::SequenceUpdate& update);
  // The last message of a request cancelled while streaming (e.g. by Cancel).
  v1::ChatResponse Cancelled();

  // Every choice ended (or the request was cancelled).
  bool finished() const { return finished_; }
  // A stop string appeared: the caller should cancel the sequence.
  bool stopped_by_string() const { return decoder_.stopped_by_string(); }
  uint32_t completion_tokens() const { return tokens_seen_; }

 private:
  void SetEnd(v1::ChatResponse& out, v1::ChatResponse::FinishReason reason, uint32_t prompt_tokens,
              uint32_t completion_tokens);
  static bool HasNews(const v1::ChatResponse& r);

  std::string request_id_;
  uint32_t prompt_tokens_;
  ChoiceDecoder decoder_;  // Feed only
  bool return_token_ids_;
  uint32_t choices_ = 1;
  uint32_t choices_finished_ = 0;
  uint32_t tokens_seen_ = 0;  // over all choices
  bool finished_ = false;
};

// "stop" / "length" / "tool_calls" -> the enum.
v1::ChatResponse::FinishReason ChatFinishReason(std::string_view openai_reason);

}  // namespace flotilla::coordinator
