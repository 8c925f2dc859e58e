// A chat request's conversation, typed: what every front end parses into
// (OpenAI chat-completions JSON: ParseChatConversation in openai.h; the
// flotilla.v1 ChatRequest: coordinator/grpc/chat_request.h) and what the
// Harmony mapping (MapChatRequest) and the structured-output constraint
// (coordinator/structured/chat_constraint.h) read. Each part keeps the name
// of the request field it came from, so that a later check (a tool_call_id
// that matches no call, a schema the matcher cannot compile) names the
// field of the request the client sent, whatever its API.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace flotilla::harmony {

enum class ChatRole { kSystem, kDeveloper, kUser, kAssistant, kTool };

// One function call of an assistant message.
struct ChatToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // JSON text; empty: {}
  // The call in the request when it is not the message's tool_calls[k]
  // (a Responses function_call item: "input[2]").
  std::string field;
};

struct ChatMessage {
  ChatRole role = ChatRole::kUser;
  std::string content;
  std::string reasoning;                 // assistant: its reasoning (analysis)
  std::vector<ChatToolCall> tool_calls;  // assistant
  std::string tool_call_id;              // tool: the call this is the result of
  std::string name;   // tool: the function called (empty: not given; else checked)
  std::string field;  // the message in the request: "messages[2]", "input[3]"
  // Where its parts are when not under `field` by their chat-completions
  // names: a Responses function_call_output's call id is "input[3].call_id";
  // a message of a stored response is "previous_response_id" throughout.
  // Empty: field + ".content" (".reasoning", ".tool_call_id").
  std::string content_field, reasoning_field, tool_call_id_field;

  std::string ContentField() const { return PartField(content_field, ".content"); }
  std::string ReasoningField() const { return PartField(reasoning_field, ".reasoning"); }
  std::string ToolCallIdField() const { return PartField(tool_call_id_field, ".tool_call_id"); }
  std::string ToolCallField(size_t k) const {
    return tool_calls[k].field.empty() ? field + ".tool_calls[" + std::to_string(k) + "]"
                                       : tool_calls[k].field;
  }

 private:
  std::string PartField(const std::string& named, const char* suffix) const {
    return named.empty() ? field + suffix : named;
  }
};

// A function the model may call.
struct ChatTool {
  std::string name;
  std::string description;
  std::optional<nlohmann::ordered_json> parameters;  // a JSON Schema
  bool strict = false;  // its calls' arguments are constrained to the schema
  // The tool in the request, under which `name` and `strict` are:
  // "tools[0].function" (OpenAI JSON) or "tools[0]" (the proto).
  std::string field;
  // The field of the schema: "tools[0].function.parameters" or
  // "tools[0].parameters_json".
  std::string parameters_field;
};

struct ChatToolChoice {
  enum class Mode { kAuto, kNone, kRequired, kFunction };
  Mode mode = Mode::kAuto;
  std::string function;  // kFunction: the tool to call
  // The field naming the function: "tool_choice.function.name" (OpenAI
  // JSON) or "tool_choice.function" (the proto).
  std::string function_field = "tool_choice.function.name";
};

// The shape the answer (the final channel) must have.
struct ChatResponseFormat {
  enum class Type { kText, kJsonObject, kJsonSchema };
  Type type = Type::kText;
  nlohmann::ordered_json schema;  // kJsonSchema: a JSON Schema object
  // The field of the schema: "response_format.json_schema.schema" (OpenAI
  // JSON) or "response_format.json_schema.schema_json" (the proto).
  std::string schema_field;
};

struct ChatConversation {
  std::vector<ChatMessage> messages;  // oldest first
  // The field holding the messages ("messages"; the Responses API's "input").
  std::string messages_field = "messages";
  std::vector<ChatTool> tools;  // in the request's order
  ChatToolChoice tool_choice;
  std::optional<std::string> reasoning_effort;  // "low", "medium" or "high"
  std::optional<ChatResponseFormat> response_format;
};

}  // namespace flotilla::harmony
