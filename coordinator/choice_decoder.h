// One choice's generated tokens -> typed events (request_events.h). Chat
// tokens go through the streaming Harmony parser (reasoning, answer text,
// function calls, and where each message begins and ends), completion
// tokens through the streaming detokenizer; the
// answer text passes the stop-string filter. No I/O: RequestSession drives
// one per choice, tests feed it recorded tokens.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/types/span.h"
#include "common/harmony/openai.h"
#include "common/harmony/parser.h"
#include "common/tokenizer/streaming_detokenizer.h"
#include "common/tokenizer/tokenizer.h"
#include "coordinator/request_events.h"
#include "coordinator/stop_filter.h"

namespace flotilla::coordinator {

// How a request's tokens are read.
enum class Decoding {
  kHarmony,  // chat: an assistant message in Harmony
  kText,     // completions and Generate: plain text
};

// OpenAI's finish_reason of a choice the worker ended with `worker_reason`
// (STOP also for a stop string): "length" whenever the length limit ended it,
// even inside a function call (whose arguments are then cut); "tool_calls"
// when a finished call ended the turn; else "stop".
std::string FinishReasonName(common::FinishReason worker_reason, bool tool_call);

class ChoiceDecoder {
 public:
  // `tokenizer` must outlive the decoder. `call_id_seed` seeds the function
  // call ids (unique per choice).
  ChoiceDecoder(const tokenizer::Tokenizer* tokenizer, Decoding decoding, uint32_t choice,
                std::string call_id_seed, std::vector<std::string> stop);

  // Text that precedes the generation (completions' `echo`): a content event,
  // not subject to the stop strings.
  void Prepend(std::string_view text, std::vector<RequestEvent>& out) const;
  // Decodes generated tokens. After a stop string, further tokens are ignored.
  void Feed(absl::Span<const tokenizer::TokenId> tokens, std::vector<RequestEvent>& out);
  // Ends the choice: `reason` is the worker's, `stop_token` the end token it
  // stopped on (not among the fed tokens). Emits the held-back text and then
  // kFinish with `usage`. Does nothing the second time.
  void Finish(common::FinishReason reason, std::optional<tokenizer::TokenId> stop_token,
              TokenUsage usage, std::vector<RequestEvent>& out);

  bool stopped_by_string() const { return filter_.hit(); }
  // The reasoning tokens so far (TokenUsage::reasoning_tokens).
  uint32_t reasoning_tokens() const { return reasoning_tokens_; }
  bool finished() const { return finished_; }
  uint32_t choice() const { return choice_; }

 private:
  RequestEvent Event(RequestEvent::Kind kind) const;
  void EmitContent(const std::string& text, std::vector<RequestEvent>& out) const;
  void ProcessToken(tokenizer::TokenId token, std::vector<RequestEvent>& out);
  // The Harmony deltas of one parsed token as events.
  void EmitDelta(const nlohmann::ordered_json& delta, std::vector<RequestEvent>& out);
  // The kMessageStart of `message`, when the answer shows it.
  void EmitMessageStart(const harmony::Message& message, std::vector<RequestEvent>& out) const;
  // A header cut off by the length limit, recovered by the parser's Finish.
  void EmitRecovered(std::vector<RequestEvent>& out);

  const tokenizer::Tokenizer* tok_;
  Decoding decoding_;
  uint32_t choice_;
  StopFilter filter_;
  harmony::StreamParser parser_;
  harmony::ChatDeltaMapper mapper_;
  tokenizer::StreamingDetokenizer detok_;
  bool tool_calls_ = false;
  bool finished_ = false;
  uint32_t reasoning_tokens_ = 0;
};

}  // namespace flotilla::coordinator
