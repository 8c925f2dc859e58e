// Responses input items -> the typed conversation's messages
// (common/harmony/chat_request.h), which the chat pipeline renders with
// Harmony. A user/system/developer message is that message; a run of
// assistant-side items (reasoning, assistant message, function_call) is one
// assistant message (reasoning, content, tool calls), split where Harmony's
// order within a turn (analysis, then commentary or final, then calls) would
// reorder the items; a function_call_output is a tool message. A reasoning
// item's `encrypted_content` (what this server sealed for include:
// ["reasoning.encrypted_content"]) is opened and is its text. Each message
// names the items it came from ("input[2].call_id"), so that the mapping's
// errors name Responses fields. Only the items' structure is checked here;
// whether an output matches an earlier call is the mapping's to say.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/harmony/chat_request.h"
#include "coordinator/http/openai_pipeline.h"
#include "coordinator/http/responses_cipher.h"

namespace flotilla::coordinator {

class ChatMessageBuilder {
 public:
  // Appends to `messages`. `cipher` opens encrypted_content (null: such
  // items are refused).
  explicit ChatMessageBuilder(std::vector<harmony::ChatMessage>* messages,
                              const ReasoningCipher* cipher = nullptr);

  // How a message names the parts of the item it came from.
  enum class Naming {
    kParts,      // "input[2].content", "input[3].call_id"
    kWholeItem,  // every part is `where` (the items of previous_response_id)
  };
  // Adds one item; `where` names it in errors ("input[2]"). Unsupported item
  // types and content parts, and encrypted_content this server cannot open
  // (another key's, altered), are INVALID_ARGUMENT naming the field.
  absl::Status Add(const Json& item, const std::string& where, Naming naming = Naming::kParts);
  // Ends the assistant message being gathered; call after the last item.
  void Flush();

 private:
  absl::Status AddMessage(const Json& item, const std::string& where);
  absl::Status AddReasoning(const Json& item, const std::string& where);
  // The text `sealed` (an item's encrypted_content, named `where`) holds.
  absl::StatusOr<std::string> OpenReasoning(const Json& sealed, const std::string& where) const;
  absl::Status AddCall(const Json& item, const std::string& where);
  absl::Status AddOutput(const Json& item, const std::string& where);
  // The field of the item `where`'s part `suffix` (".content").
  std::string Part(const std::string& where, const char* suffix) const;
  // The assistant message being gathered, begun by the item `where` if none.
  harmony::ChatMessage& Pending(const std::string& where);
  // Ends the assistant message being gathered and appends `message`.
  void Push(harmony::ChatMessage message);

  std::vector<harmony::ChatMessage>* messages_;
  const ReasoningCipher* cipher_;
  Naming naming_ = Naming::kParts;  // the current item's
  // The assistant message being gathered, and which of its parts it has.
  std::optional<harmony::ChatMessage> pending_;
  bool pending_reasoning_ = false, pending_content_ = false;
};

}  // namespace flotilla::coordinator
