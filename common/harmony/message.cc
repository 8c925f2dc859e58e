#include "common/harmony/message.h"

#include <optional>

#include "absl/strings/str_cat.h"
#include "common/enum_names.h"
#include "common/harmony/errors.h"
#include "common/status.h"
#include "common/tokenizer/tokenizer.h"

namespace flotilla::harmony {
namespace {

using Json = nlohmann::ordered_json;

constexpr EnumName<Role> kRoles[] = {{Role::kSystem, "system"},
                                     {Role::kDeveloper, "developer"},
                                     {Role::kUser, "user"},
                                     {Role::kAssistant, "assistant"},
                                     {Role::kTool, "tool"}};

// Reads an optional string field: absent leaves `out` alone, null clears it.
absl::Status OptString(const Json& obj, const char* key, const std::string& where,
                       std::optional<std::string>& out) {
  auto it = obj.find(key);
  if (it == obj.end()) return absl::OkStatus();
  if (it->is_null()) {
    out.reset();
    return absl::OkStatus();
  }
  if (!it->is_string()) return Invalid(absl::StrCat(where, ".", key), "must be a string");
  out = it->get<std::string>();
  return tokenizer::CheckUtf8(*out, absl::StrCat(where, ".", key));
}

absl::Status String(const Json& obj, const char* key, const std::string& where, std::string& out) {
  std::optional<std::string> v;
  FLOTILLA_RETURN_IF_ERROR(OptString(obj, key, where, v));
  out = v.value_or("");
  return absl::OkStatus();
}

absl::StatusOr<SystemContent> SystemFromJson(const Json& j, const std::string& where) {
  if (!j.is_object()) return Invalid(where, "must be an object");
  static const char* kKeys[] = {"model_identity", "reasoning_effort", "knowledge_cutoff",
                                "conversation_start_date", "required_channels", "browser",
                                "python", "tools"};
  for (auto it = j.begin(); it != j.end(); ++it) {
    bool known = false;
    for (const char* k : kKeys) known |= it.key() == k;
    if (!known) return Invalid(where, absl::StrCat("unknown field '", it.key(), "'"));
  }
  SystemContent s;
  FLOTILLA_RETURN_IF_ERROR(OptString(j, "model_identity", where, s.model_identity));
  FLOTILLA_RETURN_IF_ERROR(OptString(j, "reasoning_effort", where, s.reasoning_effort));
  if (s.reasoning_effort) {
    std::string& e = *s.reasoning_effort;
    for (char& c : e) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (e != "low" && e != "medium" && e != "high") {
      return Invalid(where + ".reasoning_effort",
                     absl::StrCat("must be low, medium or high, not '", e, "'"));
    }
  }
  FLOTILLA_RETURN_IF_ERROR(OptString(j, "knowledge_cutoff", where, s.knowledge_cutoff));
  FLOTILLA_RETURN_IF_ERROR(OptString(j, "conversation_start_date", where, s.conversation_start_date));
  if (auto it = j.find("required_channels"); it != j.end() && !it->is_null()) {
    if (!it->is_array()) return Invalid(where + ".required_channels", "must be an array of strings");
    s.required_channels.clear();
    for (const auto& c : *it) {
      if (!c.is_string()) return Invalid(where + ".required_channels", "must be an array of strings");
      s.required_channels.push_back(c.get<std::string>());
    }
  }
  for (const char* key : {"browser", "python"}) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) continue;
    if (!it->is_boolean()) return Invalid(absl::StrCat(where, ".", key), "must be a boolean");
    (std::string(key) == "browser" ? s.browser_tool : s.python_tool) = it->get<bool>();
  }
  // "tools": {"browser": ..., "python": ...} as in the reference format.
  if (auto it = j.find("tools"); it != j.end() && !it->is_null()) {
    if (!it->is_object()) return Invalid(where + ".tools", "must be an object");
    for (auto t = it->begin(); t != it->end(); ++t) {
      if (t.key() == "browser") {
        s.browser_tool = true;
      } else if (t.key() == "python") {
        s.python_tool = true;
      } else {
        return Invalid(where + ".tools",
                       absl::StrCat("unknown built-in tool '", t.key(), "' (browser or python)"));
      }
    }
  }
  return s;
}

absl::StatusOr<ToolDescription> ToolFromJson(const Json& j, const std::string& where) {
  if (!j.is_object()) return Invalid(where, "must be an object");
  ToolDescription t;
  FLOTILLA_RETURN_IF_ERROR(String(j, "name", where, t.name));
  if (t.name.empty()) return Invalid(where + ".name", "is required");
  for (char c : t.name) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-')) {
      return Invalid(where + ".name",
                     absl::StrCat("'", t.name, "' must use only letters, digits, '_' and '-'"));
    }
  }
  FLOTILLA_RETURN_IF_ERROR(String(j, "description", where, t.description));
  if (auto it = j.find("parameters"); it != j.end() && !it->is_null()) {
    if (!it->is_object()) return Invalid(where + ".parameters", "must be a JSON Schema object");
    t.parameters = *it;
  }
  return t;
}

absl::StatusOr<DeveloperContent> DeveloperFromJson(const Json& j, const std::string& where) {
  if (!j.is_object()) return Invalid(where, "must be an object");
  DeveloperContent d;
  FLOTILLA_RETURN_IF_ERROR(OptString(j, "instructions", where, d.instructions));
  for (const char* key : {"function_tools", "tools"}) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) continue;
    if (!it->is_array()) return Invalid(absl::StrCat(where, ".", key), "must be an array");
    for (size_t i = 0; i < it->size(); ++i) {
      FLOTILLA_ASSIGN_OR_RETURN(ToolDescription t,
                                ToolFromJson((*it)[i], absl::StrCat(where, ".", key, "[", i, "]")));
      d.function_tools.push_back(std::move(t));
    }
  }
  return d;
}

// The content only a message of `owner`'s role carries, under `key` (the
// role's name): read when the message has that role (defaults when absent),
// refused on a message of another role.
template <typename Content, typename Read>
absl::Status ReadRoleContent(const Json& j, const std::string& where, Role role, Role owner,
                             const std::string& key, std::optional<Content>& out, Read read) {
  auto it = j.find(key);
  if (role != owner) {
    if (it == j.end()) return absl::OkStatus();
    return Invalid(where + "." + key, "only a " + key + " message may carry " + key + " content");
  }
  if (it == j.end()) {
    out = Content();
    return absl::OkStatus();
  }
  FLOTILLA_ASSIGN_OR_RETURN(out, read(*it, where + "." + key));
  return absl::OkStatus();
}

}  // namespace

const char* RoleName(Role role) {
  const char* name = NameIn(kRoles, role);
  return name != nullptr ? name : "unknown";
}

absl::StatusOr<Role> ParseRole(const std::string& name) {
  if (std::optional<Role> role = ValueIn(kRoles, name)) return *role;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown role '", name, "' (expected system, developer, user, assistant or tool)"));
}

absl::StatusOr<Message> MessageFromJson(const Json& j, const std::string& where) {
  if (!j.is_object()) return Invalid(where, "must be an object");
  auto role_it = j.find("role");
  if (role_it == j.end() || !role_it->is_string()) return Invalid(where + ".role", "is required (a string)");
  Message m;
  auto role = ParseRole(role_it->get<std::string>());
  if (!role.ok()) return Invalid(where + ".role", std::string(role.status().message()));
  m.role = *role;
  FLOTILLA_RETURN_IF_ERROR(String(j, "name", where, m.name));
  FLOTILLA_RETURN_IF_ERROR(String(j, "recipient", where, m.recipient));
  FLOTILLA_RETURN_IF_ERROR(String(j, "channel", where, m.channel));
  FLOTILLA_RETURN_IF_ERROR(String(j, "content_type", where, m.content_type));
  if (auto it = j.find("content"); it != j.end() && !it->is_null()) {
    if (it->is_string()) {
      m.content = it->get<std::string>();
    } else if (it->is_array()) {
      // [{"type": "text", "text": "..."}]
      for (size_t i = 0; i < it->size(); ++i) {
        const auto& part = (*it)[i];
        const std::string pw = absl::StrCat(where, ".content[", i, "]");
        if (!part.is_object() || !part.contains("text") || !part["text"].is_string()) {
          return Invalid(pw, "must be {\"type\": \"text\", \"text\": STRING}");
        }
        m.content += part["text"].get<std::string>();
      }
    } else {
      return Invalid(where + ".content", "must be a string or an array of text parts");
    }
    FLOTILLA_RETURN_IF_ERROR(tokenizer::CheckUtf8(m.content, where + ".content"));
  }
  FLOTILLA_RETURN_IF_ERROR(
      ReadRoleContent(j, where, m.role, Role::kSystem, "system", m.system, SystemFromJson));
  FLOTILLA_RETURN_IF_ERROR(ReadRoleContent(j, where, m.role, Role::kDeveloper, "developer",
                                           m.developer, DeveloperFromJson));
  // A developer message without developer content: its text is the instructions.
  if (m.role == Role::kDeveloper && !j.contains("developer") && !m.content.empty()) {
    m.developer->instructions = m.content;
  }
  if (m.role == Role::kTool && m.name.empty()) {
    return Invalid(where + ".name", "a tool message needs the tool's name (e.g. functions.get_weather)");
  }
  return m;
}

absl::StatusOr<std::vector<Message>> ConversationFromJson(const Json& j) {
  const Json* arr = &j;
  if (j.is_object()) {
    auto it = j.find("conversation");
    if (it == j.end()) it = j.find("messages");
    if (it == j.end()) {
      return absl::InvalidArgumentError("conversation JSON needs a \"conversation\" array");
    }
    arr = &*it;
  }
  if (!arr->is_array()) return absl::InvalidArgumentError("conversation must be an array of messages");
  std::vector<Message> out;
  for (size_t i = 0; i < arr->size(); ++i) {
    FLOTILLA_ASSIGN_OR_RETURN(Message m, MessageFromJson((*arr)[i], absl::StrCat("conversation[", i, "]")));
    out.push_back(std::move(m));
  }
  return out;
}

Json MessageToJson(const Message& m) {
  Json j;
  j["role"] = RoleName(m.role);
  if (!m.name.empty()) j["name"] = m.name;
  if (!m.channel.empty()) j["channel"] = m.channel;
  if (!m.recipient.empty()) j["recipient"] = m.recipient;
  if (!m.content_type.empty()) j["content_type"] = m.content_type;
  j["content"] = m.content;
  return j;
}

}  // namespace flotilla::harmony
