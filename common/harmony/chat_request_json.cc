// OpenAI chat-completions JSON -> ChatConversation (ParseChatConversation in
// openai.h): the shape and type of every field the conversation holds.
#include "absl/strings/str_cat.h"
#include "common/harmony/errors.h"
#include "common/harmony/openai.h"
#include "common/status.h"
#include "common/tokenizer/tokenizer.h"

namespace flotilla::harmony {
namespace {

using Json = nlohmann::ordered_json;

// The member `key`; null when absent or JSON null.
const Json* Member(const Json& obj, const char* key) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

// `content`: a string, null, or an array of {"type": "text", "text": ...} parts.
absl::StatusOr<std::string> ContentText(const Json& msg, const std::string& where) {
  const Json* c = Member(msg, "content");
  if (c == nullptr) return std::string();
  if (c->is_string()) return c->get<std::string>();
  if (!c->is_array()) {
    return Invalid(where + ".content", "must be a string, null or an array of text parts");
  }
  std::string out;
  for (size_t i = 0; i < c->size(); ++i) {
    const Json& part = (*c)[i];
    const std::string pw = absl::StrCat(where, ".content[", i, "]");
    if (!part.is_object()) return Invalid(pw, "must be an object");
    const Json* type = Member(part, "type");
    if (type == nullptr || !type->is_string()) return Invalid(pw + ".type", "is required");
    if (*type != "text") {
      return Invalid(pw + ".type", absl::StrCat("content part type '", type->get<std::string>(),
                                                "' is not supported (only text)"));
    }
    const Json* text = Member(part, "text");
    if (text == nullptr || !text->is_string()) return Invalid(pw + ".text", "must be a string");
    out += text->get<std::string>();
  }
  return out;
}

absl::StatusOr<std::string> OptionalString(const Json& obj, const char* key,
                                           const std::string& where) {
  const Json* v = Member(obj, key);
  if (v == nullptr) return std::string();
  if (!v->is_string()) return Invalid(absl::StrCat(where, ".", key), "must be a string");
  return v->get<std::string>();
}

// Every string in a JSON value must be UTF-8 (values built in code, not
// parsed, may hold anything).
absl::Status CheckJsonUtf8(const Json& j, const std::string& where, int depth = 0) {
  if (depth > 64) return Invalid(where, "is nested more than 64 levels deep");
  if (j.is_string()) return tokenizer::CheckUtf8(j.get_ref<const std::string&>(), where);
  if (j.is_array()) {
    for (size_t i = 0; i < j.size(); ++i) {
      FLOTILLA_RETURN_IF_ERROR(CheckJsonUtf8(j[i], absl::StrCat(where, "[", i, "]"), depth + 1));
    }
  } else if (j.is_object()) {
    for (auto it = j.begin(); it != j.end(); ++it) {
      FLOTILLA_RETURN_IF_ERROR(tokenizer::CheckUtf8(it.key(), where + " key"));
      FLOTILLA_RETURN_IF_ERROR(
          CheckJsonUtf8(it.value(), absl::StrCat(where, ".", it.key()), depth + 1));
    }
  }
  return absl::OkStatus();
}

absl::Status ReadTools(const Json& request, ChatConversation& out) {
  const Json* tools = Member(request, "tools");
  if (tools == nullptr) return absl::OkStatus();
  if (!tools->is_array()) return Invalid("tools", "must be an array");
  for (size_t i = 0; i < tools->size(); ++i) {
    const Json& t = (*tools)[i];
    const std::string where = absl::StrCat("tools[", i, "]");
    if (!t.is_object()) return Invalid(where, "must be an object");
    if (auto type = t.find("type");
        type != t.end() && !(type->is_string() && *type == "function")) {
      return Invalid(where + ".type", "only \"function\" tools are supported");
    }
    auto fn = t.find("function");
    if (fn == t.end() || !fn->is_object()) {
      return Invalid(where + ".function", "is required (an object)");
    }
    ChatTool tool;
    tool.field = where + ".function";
    tool.parameters_field = tool.field + ".parameters";
    FLOTILLA_ASSIGN_OR_RETURN(tool.name, OptionalString(*fn, "name", tool.field));
    FLOTILLA_ASSIGN_OR_RETURN(tool.description, OptionalString(*fn, "description", tool.field));
    if (const Json* p = Member(*fn, "parameters")) tool.parameters = *p;
    if (const Json* strict = Member(*fn, "strict")) {
      if (!strict->is_boolean()) return Invalid(tool.field + ".strict", "must be a boolean");
      tool.strict = strict->get<bool>();
    }
    out.tools.push_back(std::move(tool));
  }
  return absl::OkStatus();
}

absl::Status ReadToolChoice(const Json& request, ChatToolChoice& out) {
  const Json* c = Member(request, "tool_choice");
  if (c == nullptr) return absl::OkStatus();
  if (c->is_string()) {
    const std::string mode = c->get<std::string>();
    if (mode == "none") {
      out.mode = ChatToolChoice::Mode::kNone;
    } else if (mode == "required") {
      out.mode = ChatToolChoice::Mode::kRequired;
    } else if (mode != "auto") {
      return Invalid("tool_choice", absl::StrCat("must be \"none\", \"auto\", \"required\" "
                                                 "or a function, not '",
                                                 mode, "'"));
    }
    return absl::OkStatus();
  }
  if (!c->is_object()) return Invalid("tool_choice", "must be a string or an object");
  const Json* type = Member(*c, "type");
  const Json* fn = Member(*c, "function");
  const Json* name = fn != nullptr && fn->is_object() ? Member(*fn, "name") : nullptr;
  if (type == nullptr || !type->is_string() || *type != "function" || name == nullptr ||
      !name->is_string()) {
    return Invalid("tool_choice",
                   "must be {\"type\": \"function\", \"function\": {\"name\": NAME}}");
  }
  out.mode = ChatToolChoice::Mode::kFunction;
  out.function = name->get<std::string>();
  out.function_field = "tool_choice.function.name";
  return absl::OkStatus();
}

absl::Status ReadResponseFormat(const Json& request, ChatConversation& out) {
  const Json* f = Member(request, "response_format");
  if (f == nullptr) return absl::OkStatus();
  if (!f->is_object()) return Invalid("response_format", "must be an object");
  const Json* type = Member(*f, "type");
  if (type == nullptr || !type->is_string()) {
    return Invalid("response_format.type",
                   "is required: \"text\", \"json_object\" or \"json_schema\"");
  }
  const std::string t = type->get<std::string>();
  ChatResponseFormat format;
  if (t == "text") {
    format.type = ChatResponseFormat::Type::kText;
  } else if (t == "json_object") {
    format.type = ChatResponseFormat::Type::kJsonObject;
  } else if (t == "json_schema") {
    format.type = ChatResponseFormat::Type::kJsonSchema;
    const Json* js = Member(*f, "json_schema");
    if (js == nullptr || !js->is_object()) {
      return Invalid("response_format.json_schema", "is required (an object with a schema)");
    }
    const Json* schema = Member(*js, "schema");
    if (schema == nullptr || !schema->is_object()) {
      return Invalid("response_format.json_schema.schema", "is required (a JSON Schema object)");
    }
    if (const Json* strict = Member(*js, "strict"); strict != nullptr && !strict->is_boolean()) {
      return Invalid("response_format.json_schema.strict", "must be a boolean");
    }
    format.schema = *schema;
    format.schema_field = "response_format.json_schema.schema";
  } else {
    return Invalid(
        "response_format.type",
        absl::StrCat("must be \"text\", \"json_object\" or \"json_schema\", not '", t, "'"));
  }
  out.response_format = std::move(format);
  return absl::OkStatus();
}

absl::Status ReadToolCalls(const Json& m, const std::string& where, ChatMessage& out) {
  const Json* tc = Member(m, "tool_calls");
  if (tc == nullptr) return absl::OkStatus();
  if (!tc->is_array()) return Invalid(where + ".tool_calls", "must be an array");
  for (size_t k = 0; k < tc->size(); ++k) {
    const Json& call = (*tc)[k];
    const std::string cw = absl::StrCat(where, ".tool_calls[", k, "]");
    if (!call.is_object()) return Invalid(cw, "must be an object");
    ChatToolCall c;
    FLOTILLA_ASSIGN_OR_RETURN(c.id, OptionalString(call, "id", cw));
    if (c.id.empty()) return Invalid(cw + ".id", "is required");
    const Json* fn = Member(call, "function");
    if (fn == nullptr || !fn->is_object()) {
      return Invalid(cw + ".function", "is required (an object)");
    }
    FLOTILLA_ASSIGN_OR_RETURN(c.name, OptionalString(*fn, "name", cw + ".function"));
    if (c.name.empty()) return Invalid(cw + ".function.name", "is required");
    if (const Json* a = Member(*fn, "arguments")) {
      c.arguments = a->is_string() ? a->get<std::string>() : a->dump();
    }
    out.tool_calls.push_back(std::move(c));
  }
  return absl::OkStatus();
}

absl::StatusOr<ChatMessage> ReadMessage(const Json& m, const std::string& where) {
  if (!m.is_object()) return Invalid(where, "must be an object");
  const Json* role = Member(m, "role");
  if (role == nullptr || !role->is_string()) {
    return Invalid(where + ".role", "is required (a string)");
  }
  ChatMessage out;
  out.field = where;
  FLOTILLA_ASSIGN_OR_RETURN(out.content, ContentText(m, where));
  const std::string r = role->get<std::string>();
  if (r == "system") {
    out.role = ChatRole::kSystem;
  } else if (r == "developer") {
    out.role = ChatRole::kDeveloper;
  } else if (r == "user") {
    out.role = ChatRole::kUser;
  } else if (r == "assistant") {
    out.role = ChatRole::kAssistant;
    for (const char* key : {"reasoning_content", "reasoning"}) {
      FLOTILLA_ASSIGN_OR_RETURN(std::string text, OptionalString(m, key, where));
      if (!text.empty()) out.reasoning = text;
    }
    FLOTILLA_RETURN_IF_ERROR(ReadToolCalls(m, where, out));
  } else if (r == "tool") {
    out.role = ChatRole::kTool;
    FLOTILLA_ASSIGN_OR_RETURN(out.tool_call_id, OptionalString(m, "tool_call_id", where));
    if (out.tool_call_id.empty()) {
      return Invalid(where + ".tool_call_id", "is required for a tool message");
    }
  } else {
    return Invalid(where + ".role",
                   absl::StrCat("unknown role '", r,
                                "' (expected system, developer, user, assistant or tool)"));
  }
  return out;
}

}  // namespace

absl::StatusOr<ChatConversation> ParseChatConversation(const Json& request) {
  if (!request.is_object()) return absl::InvalidArgumentError("request must be a JSON object");
  FLOTILLA_RETURN_IF_ERROR(CheckJsonUtf8(request, "request"));
  ChatConversation out;
  if (const Json* effort = Member(request, "reasoning_effort")) {
    if (!effort->is_string() || (*effort != "low" && *effort != "medium" && *effort != "high")) {
      return Invalid("reasoning_effort", absl::StrCat("must be \"low\", \"medium\" or "
                                                      "\"high\", not ",
                                                      effort->dump()));
    }
    out.reasoning_effort = effort->get<std::string>();
  }
  FLOTILLA_RETURN_IF_ERROR(ReadTools(request, out));
  FLOTILLA_RETURN_IF_ERROR(ReadToolChoice(request, out.tool_choice));
  FLOTILLA_RETURN_IF_ERROR(ReadResponseFormat(request, out));
  const Json* msgs = Member(request, "messages");
  if (msgs == nullptr || !msgs->is_array() || msgs->empty()) {
    return Invalid("messages", "is required (a non-empty array)");
  }
  for (size_t i = 0; i < msgs->size(); ++i) {
    FLOTILLA_ASSIGN_OR_RETURN(ChatMessage m,
                              ReadMessage((*msgs)[i], absl::StrCat("messages[", i, "]")));
    out.messages.push_back(std::move(m));
  }
  return out;
}

}  // namespace flotilla::harmony
