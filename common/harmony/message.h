// The Harmony chat format's data model: messages with an author, an optional
// recipient, channel and content type, and text content; the system and
// developer messages carry structured content that the renderer expands.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"

namespace flotilla::harmony {

enum class Role { kSystem, kDeveloper, kUser, kAssistant, kTool };

// "system", "developer", "user", "assistant", "tool".
const char* RoleName(Role role);
// Parses a role name; InvalidArgument naming the bad value otherwise.
absl::StatusOr<Role> ParseRole(const std::string& name);

// A function tool: name, description and JSON Schema of its parameters. The
// schema is kept in its original key order (the rendered namespace follows it).
struct ToolDescription {
  std::string name;
  std::string description;
  std::optional<nlohmann::ordered_json> parameters;
};

// The system message's content. Defaults are those of gpt-oss's own prompts.
struct SystemContent {
  std::optional<std::string> model_identity =
      std::string("You are ChatGPT, a large language model trained by OpenAI.");
  std::optional<std::string> reasoning_effort = std::string("medium");  // low|medium|high
  std::optional<std::string> knowledge_cutoff = std::string("2024-06");
  std::optional<std::string> conversation_start_date;  // YYYY-MM-DD
  std::vector<std::string> required_channels = {"analysis", "commentary", "final"};
  bool browser_tool = false;  // built-in `browser` tool namespace
  bool python_tool = false;   // built-in `python` tool
};

struct DeveloperContent {
  std::optional<std::string> instructions;
  std::vector<ToolDescription> function_tools;
};

struct Message {
  Role role = Role::kUser;
  // The author's name; for a tool result the tool, e.g. "functions.get_weather".
  std::string name;
  std::string recipient;     // e.g. "functions.get_weather"; empty: everyone
  std::string channel;       // analysis | commentary | final; empty: none
  std::string content_type;  // e.g. "json", "code", "<|constrain|>json"
  std::string content;       // text content
  std::optional<SystemContent> system;        // role == kSystem
  std::optional<DeveloperContent> developer;  // role == kDeveloper
};

// JSON in the schema of the Harmony reference cases:
//   {"role": "user", "content": "...", "channel"?, "recipient"?, "content_type"?, "name"?,
//    "system"?: {"model_identity", "reasoning_effort", "knowledge_cutoff",
//                "conversation_start_date", "required_channels", "browser", "python"},
//    "developer"?: {"instructions", "function_tools": [{"name", "description", "parameters"}]}}
// Errors name the offending field, prefixed by `where` (e.g. "conversation[2]").
absl::StatusOr<Message> MessageFromJson(const nlohmann::ordered_json& j, const std::string& where);
absl::StatusOr<std::vector<Message>> ConversationFromJson(const nlohmann::ordered_json& j);
// Only the fields that are set (for parsed messages: role, name, channel,
// recipient, content_type, content).
nlohmann::ordered_json MessageToJson(const Message& m);

}  // namespace flotilla::harmony
