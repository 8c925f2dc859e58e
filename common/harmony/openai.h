// Mapping between chat requests and Harmony conversations.
//
// Request -> Harmony: a request is first its typed conversation
// (chat_request.h; ParseChatConversation reads OpenAI chat-completions JSON,
// other APIs fill it themselves), which MapChatRequest maps: `system` and
// `developer` messages become the developer
// message's instructions (the Harmony system message is built from the
// request's options); `tools` become the `functions` namespace; an assistant
// message's `reasoning_content` becomes an analysis message, its `content` a
// final message (or a commentary preamble when it also has `tool_calls`), and
// each tool call a commentary message to `functions.NAME` ending with
// `<|call|>`; a `tool` message becomes the result of the call its
// `tool_call_id` names. `tool_choice`: "none" leaves the tools out of the
// prompt, "required" and a named function add an instruction to call one.
//
// Harmony -> response: final -> `content`, analysis -> `reasoning_content`,
// commentary to `functions.X` -> `tool_calls` (ids stable for a given seed).
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/harmony/chat_request.h"
#include "common/harmony/message.h"
#include "common/harmony/parser.h"

namespace flotilla::harmony {

struct OpenAiRequestOptions {
  // "Current date:" of the system message (YYYY-MM-DD); unset: no date line.
  std::optional<std::string> date;
  SystemContent system;  // identity, cutoff, default effort, channels
};

struct MappedRequest {
  std::vector<Message> conversation;
  // The tools the prompt offers (after tool_choice); empty when none.
  std::vector<std::string> function_names;
};

// OpenAI chat-completions JSON -> the typed conversation (chat_request.h):
// the shape and type of `messages`, `tools`, `tool_choice`,
// `reasoning_effort` and `response_format`, and that every string is UTF-8.
// Errors name the JSON field ("messages[2].tool_calls[0].id: ...").
absl::StatusOr<ChatConversation> ParseChatConversation(const nlohmann::ordered_json& request);

// Maps a typed conversation, whichever API it came from. Errors name the
// field the conversation says each part came from (ChatMessage::field,
// ChatTool::field, ...): "messages[2].tool_call_id: ...".
absl::StatusOr<MappedRequest> MapChatRequest(const ChatConversation& conversation,
                                             const OpenAiRequestOptions& options);
// ParseChatConversation + MapChatRequest.
absl::StatusOr<MappedRequest> MapChatRequest(const nlohmann::ordered_json& request,
                                             const OpenAiRequestOptions& options);
// Maps a request body: checks that it is UTF-8 (naming the offset of a bad
// byte) and JSON before mapping.
absl::StatusOr<MappedRequest> MapChatRequestBody(std::string_view body,
                                                 const OpenAiRequestOptions& options);

// OK for YYYY-MM-DD with a real month and day.
absl::Status CheckDate(const std::string& date);

// The id of tool call `index` of a response: "call_" + 24 hex digits derived
// from `seed` (e.g. the request id), the index and the function name, so it is
// the same in the streamed and the whole response.
std::string ToolCallId(std::string_view seed, size_t index, std::string_view name);

struct ChatReply {
  nlohmann::ordered_json message;  // {"role": "assistant", "content", ["reasoning_content"], ["tool_calls"]}
  std::string finish_reason;       // "stop", "tool_calls" or "length"
};
// Maps parsed completion messages; `ended_by` is the token that ended the last
// message (nullopt when generation stopped at the length limit).
ChatReply MapReply(const std::vector<Message>& messages, std::optional<tokenizer::TokenId> ended_by,
                   std::string_view call_id_seed);

// Turns streaming parser events into chat.completion.chunk `delta` objects.
class ChatDeltaMapper {
 public:
  explicit ChatDeltaMapper(std::string call_id_seed) : seed_(std::move(call_id_seed)) {}
  // Call after each StreamParser::Process with its event; returns the deltas
  // (possibly none) that the token produced.
  std::vector<nlohmann::ordered_json> OnEvent(const StreamParser& parser, StreamParser::Event event);
  int tool_calls() const { return tool_calls_; }

 private:
  std::string seed_;
  int tool_calls_ = 0;
  bool in_tool_call_ = false;
};

}  // namespace flotilla::harmony
