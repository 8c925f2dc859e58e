#include "common/harmony/openai.h"

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/harmony/renderer.h"
#include "common/json_parse.h"
#include "common/status.h"
#include "common/tokenizer/tokenizer.h"

namespace flotilla::harmony {
namespace {

using Json = nlohmann::ordered_json;
constexpr char kFunctionsPrefix[] = "functions.";
constexpr size_t kFunctionsPrefixLen = sizeof(kFunctionsPrefix) - 1;

absl::Status Invalid(const std::string& where, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(where, ": ", what));
}

// `content`: a string, null, or an array of {"type": "text", "text": ...} parts.
absl::StatusOr<std::string> ContentText(const Json& msg, const std::string& where) {
  auto it = msg.find("content");
  if (it == msg.end() || it->is_null()) return std::string();
  std::string out;
  if (it->is_string()) {
    out = it->get<std::string>();
  } else if (it->is_array()) {
    for (size_t i = 0; i < it->size(); ++i) {
      const Json& part = (*it)[i];
      const std::string pw = absl::StrCat(where, ".content[", i, "]");
      if (!part.is_object()) return Invalid(pw, "must be an object");
      auto type = part.find("type");
      if (type == part.end() || !type->is_string()) return Invalid(pw + ".type", "is required");
      if (*type != "text") {
        return Invalid(pw + ".type", absl::StrCat("content part type '", type->get<std::string>(),
                                                  "' is not supported (only text)"));
      }
      auto text = part.find("text");
      if (text == part.end() || !text->is_string()) return Invalid(pw + ".text", "must be a string");
      out += text->get<std::string>();
    }
  } else {
    return Invalid(where + ".content", "must be a string, null or an array of text parts");
  }
  FLOTILLA_RETURN_IF_ERROR(tokenizer::CheckUtf8(out, where + ".content"));
  return out;
}

absl::StatusOr<std::string> OptionalString(const Json& obj, const char* key, const std::string& where) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return std::string();
  if (!it->is_string()) return Invalid(absl::StrCat(where, ".", key), "must be a string");
  std::string v = it->get<std::string>();
  FLOTILLA_RETURN_IF_ERROR(tokenizer::CheckUtf8(v, absl::StrCat(where, ".", key)));
  return v;
}

// Every string in a JSON value must be UTF-8 (values built in code, not parsed,
// may hold anything).
absl::Status CheckJsonUtf8(const Json& j, const std::string& where, int depth = 0) {
  if (depth > 64) return Invalid(where, "is nested more than 64 levels deep");
  if (j.is_string()) return tokenizer::CheckUtf8(j.get_ref<const std::string&>(), where);
  if (j.is_array()) {
    for (size_t i = 0; i < j.size(); ++i) FLOTILLA_RETURN_IF_ERROR(CheckJsonUtf8(j[i], absl::StrCat(where, "[", i, "]"), depth + 1));
  } else if (j.is_object()) {
    for (auto it = j.begin(); it != j.end(); ++it) {
      FLOTILLA_RETURN_IF_ERROR(tokenizer::CheckUtf8(it.key(), where + " key"));
      FLOTILLA_RETURN_IF_ERROR(CheckJsonUtf8(it.value(), absl::StrCat(where, ".", it.key()), depth + 1));
    }
  }
  return absl::OkStatus();
}

uint64_t Fnv1a(std::string_view s, uint64_t h) {
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

}  // namespace

absl::Status CheckDate(const std::string& d) {
  int y, m, day;
  char tail;
  if (d.size() != 10 || d[4] != '-' || d[7] != '-' ||
      std::sscanf(d.c_str(), "%4d-%2d-%2d%c", &y, &m, &day, &tail) != 3 || m < 1 || m > 12 || day < 1) {
    return absl::InvalidArgumentError(absl::StrCat("date '", d, "' is not YYYY-MM-DD"));
  }
  static constexpr int kDays[] = {31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  const bool leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
  if (day > kDays[m - 1] || (m == 2 && day == 29 && !leap)) {
    return absl::InvalidArgumentError(absl::StrCat("date '", d, "' does not exist"));
  }
  return absl::OkStatus();
}

std::string ToolCallId(std::string_view seed, size_t index, std::string_view name) {
  uint64_t a = Fnv1a(seed, 0xcbf29ce484222325ull);
  a = Fnv1a(absl::StrCat("#", index, "#"), a);
  a = Fnv1a(name, a);
  uint64_t b = Fnv1a(name, Fnv1a(seed, a ^ 0x9e3779b97f4a7c15ull));
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%016llx%08llx", static_cast<unsigned long long>(a),
                static_cast<unsigned long long>(b & 0xffffffffull));
  return absl::StrCat("call_", buf);
}

absl::StatusOr<MappedRequest> MapChatRequestBody(std::string_view body,
                                                 const OpenAiRequestOptions& options) {
  FLOTILLA_RETURN_IF_ERROR(tokenizer::CheckUtf8(body, "request body"));
  absl::StatusOr<Json> j = ParseJson<Json>(body, "request body");
  if (!j.ok()) return j.status();
  return MapChatRequest(*j, options);
}

absl::StatusOr<MappedRequest> MapChatRequest(const Json& request, const OpenAiRequestOptions& options) {
  if (!request.is_object()) return absl::InvalidArgumentError("request must be a JSON object");
  FLOTILLA_RETURN_IF_ERROR(CheckJsonUtf8(request, "request"));
  SystemContent system = options.system;
  if (options.date) {
    FLOTILLA_RETURN_IF_ERROR(CheckDate(*options.date));
    system.conversation_start_date = *options.date;
  }
  if (auto it = request.find("reasoning_effort"); it != request.end() && !it->is_null()) {
    if (!it->is_string() || (*it != "low" && *it != "medium" && *it != "high")) {
      return Invalid("reasoning_effort", absl::StrCat("must be \"low\", \"medium\" or \"high\", not ", it->dump()));
    }
    system.reasoning_effort = it->get<std::string>();
  }

  // tools
  std::vector<ToolDescription> tools;
  if (auto it = request.find("tools"); it != request.end() && !it->is_null()) {
    if (!it->is_array()) return Invalid("tools", "must be an array");
    for (size_t i = 0; i < it->size(); ++i) {
      const Json& t = (*it)[i];
      const std::string where = absl::StrCat("tools[", i, "]");
      if (!t.is_object()) return Invalid(where, "must be an object");
      if (auto type = t.find("type"); type != t.end() && !(type->is_string() && *type == "function")) {
        return Invalid(where + ".type", "only \"function\" tools are supported");
      }
      auto fn = t.find("function");
      if (fn == t.end() || !fn->is_object()) return Invalid(where + ".function", "is required (an object)");
      ToolDescription d;
      FLOTILLA_ASSIGN_OR_RETURN(d.name, OptionalString(*fn, "name", where + ".function"));
      if (d.name.empty()) return Invalid(where + ".function.name", "is required");
      for (char c : d.name) {
        if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-')) {
          return Invalid(where + ".function.name",
                         absl::StrCat("'", d.name, "' must use only letters, digits, '_' and '-'"));
        }
      }
      for (const auto& other : tools) {
        if (other.name == d.name) return Invalid(where + ".function.name", absl::StrCat("duplicate tool '", d.name, "'"));
      }
      FLOTILLA_ASSIGN_OR_RETURN(d.description, OptionalString(*fn, "description", where + ".function"));
      if (auto p = fn->find("parameters"); p != fn->end() && !p->is_null()) d.parameters = *p;
      // Render now so that a malformed schema is reported against the request.
      auto rendered = RenderFunctionTool(d);
      if (!rendered.ok()) return Invalid(where, std::string(rendered.status().message()));
      tools.push_back(std::move(d));
    }
  }
  std::string choice_instruction;
  if (auto it = request.find("tool_choice"); it != request.end() && !it->is_null()) {
    if (it->is_string()) {
      const std::string c = it->get<std::string>();
      if (c == "none") {
        tools.clear();
      } else if (c == "required") {
        if (tools.empty()) return Invalid("tool_choice", "\"required\" but the request has no tools");
        choice_instruction = "You must call one of the functions in the `functions` namespace before answering.";
      } else if (c != "auto") {
        return Invalid("tool_choice", absl::StrCat("must be \"none\", \"auto\", \"required\" or a function, not '", c, "'"));
      }
    } else if (it->is_object()) {
      auto fn = it->find("function");
      auto type = it->find("type");
      if (type == it->end() || !type->is_string() || *type != "function" || fn == it->end() || !fn->is_object() ||
          !fn->contains("name") || !(*fn)["name"].is_string()) {
        return Invalid("tool_choice", "must be {\"type\": \"function\", \"function\": {\"name\": NAME}}");
      }
      const std::string name = (*fn)["name"].get<std::string>();
      std::vector<ToolDescription> only;
      for (auto& t : tools) {
        if (t.name == name) only.push_back(t);
      }
      if (only.empty()) return Invalid("tool_choice.function.name", absl::StrCat("'", name, "' is not one of the request's tools"));
      tools = std::move(only);
      choice_instruction = absl::StrCat("You must call the function `functions.", name, "` before answering.");
    } else {
      return Invalid("tool_choice", "must be a string or an object");
    }
  }

  auto msgs = request.find("messages");
  if (msgs == request.end() || !msgs->is_array() || msgs->empty()) {
    return Invalid("messages", "is required (a non-empty array)");
  }
  std::vector<std::string> instructions;
  std::vector<Message> turns;
  std::vector<std::pair<std::string, std::string>> calls;  // tool_call id -> function name
  for (size_t i = 0; i < msgs->size(); ++i) {
    const Json& m = (*msgs)[i];
    const std::string where = absl::StrCat("messages[", i, "]");
    if (!m.is_object()) return Invalid(where, "must be an object");
    auto role_it = m.find("role");
    if (role_it == m.end() || !role_it->is_string()) return Invalid(where + ".role", "is required (a string)");
    const std::string role = role_it->get<std::string>();
    FLOTILLA_ASSIGN_OR_RETURN(std::string content, ContentText(m, where));
    if (role == "system" || role == "developer") {
      if (!content.empty()) instructions.push_back(content);
    } else if (role == "user") {
      Message u;
      u.role = Role::kUser;
      u.content = content;
      turns.push_back(std::move(u));
    } else if (role == "assistant") {
      std::string reasoning;
      for (const char* key : {"reasoning_content", "reasoning"}) {
        FLOTILLA_ASSIGN_OR_RETURN(std::string r, OptionalString(m, key, where));
        if (!r.empty()) reasoning = r;
      }
      if (!reasoning.empty()) {
        Message a;
        a.role = Role::kAssistant;
        a.channel = "analysis";
        a.content = reasoning;
        turns.push_back(std::move(a));
      }
      auto tc = m.find("tool_calls");
      const bool has_calls = tc != m.end() && !tc->is_null() && !(tc->is_array() && tc->empty());
      if (!content.empty()) {
        Message a;
        a.role = Role::kAssistant;
        a.channel = has_calls ? "commentary" : "final";
        a.content = content;
        turns.push_back(std::move(a));
      }
      if (has_calls) {
        if (!tc->is_array()) return Invalid(where + ".tool_calls", "must be an array");
        for (size_t k = 0; k < tc->size(); ++k) {
          const Json& call = (*tc)[k];
          const std::string cw = absl::StrCat(where, ".tool_calls[", k, "]");
          if (!call.is_object()) return Invalid(cw, "must be an object");
          FLOTILLA_ASSIGN_OR_RETURN(std::string id, OptionalString(call, "id", cw));
          if (id.empty()) return Invalid(cw + ".id", "is required");
          auto fn = call.find("function");
          if (fn == call.end() || !fn->is_object()) return Invalid(cw + ".function", "is required (an object)");
          FLOTILLA_ASSIGN_OR_RETURN(std::string name, OptionalString(*fn, "name", cw + ".function"));
          if (name.empty()) return Invalid(cw + ".function.name", "is required");
          std::string args;
          if (auto a = fn->find("arguments"); a != fn->end() && !a->is_null()) {
            args = a->is_string() ? a->get<std::string>() : a->dump();
          }
          Message a;
          a.role = Role::kAssistant;
          a.channel = "commentary";
          a.recipient = absl::StrCat(kFunctionsPrefix, name);
          a.content_type = "<|constrain|>json";
          a.content = args.empty() ? "{}" : args;
          turns.push_back(std::move(a));
          calls.emplace_back(id, name);
        }
      }
    } else if (role == "tool") {
      FLOTILLA_ASSIGN_OR_RETURN(std::string id, OptionalString(m, "tool_call_id", where));
      if (id.empty()) return Invalid(where + ".tool_call_id", "is required for a tool message");
      std::string name;
      for (const auto& [cid, cname] : calls) {
        if (cid == id) name = cname;
      }
      if (name.empty()) {
        return Invalid(where + ".tool_call_id", absl::StrCat("'", id, "' matches no earlier assistant tool call"));
      }
      Message t;
      t.role = Role::kTool;
      t.name = absl::StrCat(kFunctionsPrefix, name);
      t.recipient = "assistant";
      t.channel = "commentary";
      t.content = content;
      turns.push_back(std::move(t));
    } else {
      return Invalid(where + ".role", absl::StrCat("unknown role '", role,
                                                   "' (expected system, developer, user, assistant or tool)"));
    }
  }

  MappedRequest out;
  Message sys;
  sys.role = Role::kSystem;
  sys.system = system;
  out.conversation.push_back(std::move(sys));
  if (!choice_instruction.empty()) instructions.push_back(choice_instruction);
  if (!instructions.empty() || !tools.empty()) {
    Message dev;
    dev.role = Role::kDeveloper;
    dev.developer = DeveloperContent();
    if (!instructions.empty()) dev.developer->instructions = absl::StrJoin(instructions, "\n\n");
    dev.developer->function_tools = tools;
    out.conversation.push_back(std::move(dev));
  }
  for (auto& t : turns) out.conversation.push_back(std::move(t));
  for (const auto& t : tools) out.function_names.push_back(t.name);
  return out;
}

ChatReply MapReply(const std::vector<Message>& messages, std::optional<tokenizer::TokenId> ended_by,
                   std::string_view call_id_seed) {
  std::string content, reasoning;
  Json calls = Json::array();
  for (const Message& m : messages) {
    if (m.role != Role::kAssistant) continue;
    if (m.recipient.rfind(kFunctionsPrefix, 0) == 0) {
      const std::string name = m.recipient.substr(kFunctionsPrefixLen);
      Json call;
      call["id"] = ToolCallId(call_id_seed, calls.size(), name);
      call["type"] = "function";
      call["function"] = {{"name", name}, {"arguments", m.content}};
      calls.push_back(std::move(call));
    } else if (!m.recipient.empty()) {
      continue;  // a built-in tool's call: not an OpenAI function call
    } else if (m.channel == "analysis") {
      reasoning += m.content;
    } else {
      content += m.content;  // final, and commentary preambles
    }
  }
  ChatReply r;
  r.message["role"] = "assistant";
  r.message["content"] = content.empty() && !calls.empty() ? Json(nullptr) : Json(content);
  if (!reasoning.empty()) r.message["reasoning_content"] = reasoning;
  if (!calls.empty()) r.message["tool_calls"] = calls;
  if (!calls.empty()) {
    r.finish_reason = "tool_calls";
  } else {
    r.finish_reason = ended_by ? "stop" : "length";
  }
  return r;
}

std::vector<Json> ChatDeltaMapper::OnEvent(const StreamParser& parser, StreamParser::Event event) {
  std::vector<Json> out;
  if (event == StreamParser::Event::kMessageStarted) {
    const Message& m = parser.current();
    in_tool_call_ = m.role == Role::kAssistant && m.recipient.rfind(kFunctionsPrefix, 0) == 0;
    if (in_tool_call_) {
      const std::string name = m.recipient.substr(kFunctionsPrefixLen);
      Json call;
      call["index"] = tool_calls_;
      call["id"] = ToolCallId(seed_, tool_calls_, name);
      call["type"] = "function";
      call["function"] = {{"name", name}, {"arguments", ""}};
      out.push_back({{"tool_calls", Json::array({call})}});
      ++tool_calls_;
    }
    return out;
  }
  if (event != StreamParser::Event::kContentDelta && event != StreamParser::Event::kMessageEnded) return out;
  const std::string& delta = parser.last_content_delta();
  if (delta.empty()) return out;
  const Message& m = event == StreamParser::Event::kMessageEnded ? parser.messages().back() : parser.current();
  if (m.role != Role::kAssistant) return out;
  if (in_tool_call_) {
    Json call;
    call["index"] = tool_calls_ - 1;
    call["function"] = {{"arguments", delta}};
    out.push_back({{"tool_calls", Json::array({call})}});
  } else if (!m.recipient.empty()) {
    // built-in tool call: not streamed to OpenAI clients
  } else if (m.channel == "analysis") {
    out.push_back({{"reasoning_content", delta}});
  } else {
    out.push_back({{"content", delta}});
  }
  return out;
}

}  // namespace flotilla::harmony
