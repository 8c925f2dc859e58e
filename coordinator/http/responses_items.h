// Responses input items -> chat-completions messages, for the chat pipeline
// to render with Harmony. A user/system/developer message is that message; a
// run of assistant-side items (reasoning, assistant message, function_call)
// is one assistant message (reasoning_content, content, tool_calls), split
// where Harmony's order within a turn (analysis, then commentary or final,
// then calls) would reorder the items; a function_call_output is a tool
// message. A reasoning item's `encrypted_content` (what this server sealed
// for include: ["reasoning.encrypted_content"]) is opened and is its text. Only the items' structure is checked here; whether an output
// matches an earlier call is the chat mapping's to say.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "coordinator/http/openai_pipeline.h"
#include "coordinator/http/responses_cipher.h"

namespace flotilla::coordinator {

class ChatMessageBuilder {
 public:
  // Appends to `messages` (a JSON array) and, per message, to `origin` the
  // name of the item it came from (to rename the chat pipeline's errors).
  // `cipher` opens encrypted_content (null: such items are refused).
  ChatMessageBuilder(Json* messages, std::vector<std::string>* origin,
                     const ReasoningCipher* cipher = nullptr);

  // Adds one item; `where` names it in errors ("input[2]"). Unsupported item
  // types and content parts, and encrypted_content this server cannot open
  // (another key's, altered), are INVALID_ARGUMENT naming the field.
  absl::Status Add(const Json& item, const std::string& where);
  // Ends the assistant message being gathered; call after the last item.
  void Flush();

 private:
  absl::Status AddMessage(const Json& item, const std::string& where);
  absl::Status AddReasoning(const Json& item, const std::string& where);
  // The text `sealed` (an item's encrypted_content, named `where`) holds.
  absl::StatusOr<std::string> OpenReasoning(const Json& sealed, const std::string& where) const;
  absl::Status AddCall(const Json& item, const std::string& where);
  absl::Status AddOutput(const Json& item, const std::string& where);
  bool Has(const char* key) const;
  // The assistant message being gathered, begun by the item `where` if none.
  Json& Pending(const std::string& where);
  // Ends the assistant message being gathered and appends `message`.
  void Push(Json message, const std::string& where);

  Json* messages_;
  std::vector<std::string>* origin_;
  const ReasoningCipher* cipher_;
  Json pending_;  // the assistant message being gathered; null: none
  std::string pending_origin_;
};

}  // namespace flotilla::coordinator
