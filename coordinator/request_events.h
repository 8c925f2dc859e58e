// The typed events one generation request produces, whatever API asked for
// it. RequestSession (and, token by token, ChoiceDecoder) emits them; the
// OpenAI JSON, the gRPC protos and the Responses API only serialize them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "proto/cluster.pb.h"
#include "proto/common.pb.h"

namespace flotilla::coordinator {

// Token counts. On a kFinish event: that choice's; on the terminal kUsage or
// kError event: the whole request's (each prompt once, every choice's tokens).
struct TokenUsage {
  uint32_t prompt_tokens = 0;
  uint32_t completion_tokens = 0;
  // Of completion_tokens: the content tokens of the analysis messages
  // (Harmony), their end tokens included; the Responses API reports them.
  uint32_t reasoning_tokens = 0;
};

// A piece of a function call. The first piece of a call has its id and name;
// later pieces carry more of the arguments (a JSON text) under the same index.
struct ToolCallPiece {
  uint32_t index = 0;  // the call's place among this choice's calls
  std::string id;
  std::string name;
  std::string arguments;
};

struct RequestEvent {
  enum class Kind {
    // The raw tokens of one worker update (ids, logprobs when asked, the stop
    // token, prompt logits): for APIs that return them. Comes before the text
    // the tokens produced.
    kTokens,
    kReasoning,  // text on the analysis channel (chat)
    kContent,    // answer text (chat: the final channel; completions: the text)
    kToolCall,   // a function call piece (chat)
    // A Harmony message of the answer begins (chat): the text events up to
    // its kMessageEnd are its own, of the kind `message_kind` (a function
    // call's first kToolCall piece follows at once, with its id and name).
    // Messages the answer does not show (a built-in tool's call) have none.
    // For APIs whose output is per message (Responses); others ignore both.
    kMessageStart,
    // The message ended with its end token. One the length limit cut off has
    // none (kFinish ends it), and neither has one a stop string ended. Text a
    // stop string's filter holds back may come after it: stop strings span
    // the answer's messages, as in chat completions.
    kMessageEnd,
    kFinish,     // this choice ended: finish_reason, usage
    // Terminal, success: every choice finished; usage sums them.
    kUsage,
    // Terminal, failure: `status` (CANCELLED after a cancel, DEADLINE_EXCEEDED,
    // UNAVAILABLE ...); usage is what was produced so far.
    kError,
  };
  Kind kind = Kind::kContent;
  // The choice: prompt_index * n + i (OpenAI's numbering); 0 for terminal events.
  uint32_t choice = 0;
  std::string text;         // kReasoning, kContent
  ToolCallPiece tool_call;  // kToolCall
  // kMessageStart: kReasoning (analysis), kContent (final, preambles) or kToolCall.
  Kind message_kind = Kind::kContent;
  // kTokens: the update. Valid only while the event is being handled.
  const cluster::SequenceUpdate* update = nullptr;
  // kFinish: "stop" (end token or stop string), "length" (the length limit,
  // also inside a function call), "tool_calls" (a finished call ended the
  // turn): FinishReasonName (choice_decoder.h).
  std::string finish_reason;
  // kFinish: the worker's reason (STOP also for a stop string).
  common::FinishReason worker_reason = common::FINISH_REASON_UNSPECIFIED;
  bool stopped_by_string = false;  // kFinish: a stop string ended the choice
  TokenUsage usage;                // kFinish, kUsage, kError
  absl::Status status;             // kError
};

// How a batch of a session's events ends its request: OK after a terminal
// kUsage, the error after a kError; nullopt while the request goes on.
inline std::optional<absl::Status> RequestEnd(const std::vector<RequestEvent>& events) {
  if (events.empty()) return std::nullopt;
  const RequestEvent& last = events.back();
  if (last.kind == RequestEvent::Kind::kUsage) return absl::OkStatus();
  if (last.kind == RequestEvent::Kind::kError) return last.status;
  return std::nullopt;
}

}  // namespace flotilla::coordinator
