#include "common/harmony/openai.h"

#include <cctype>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/harmony/errors.h"
#include "common/harmony/renderer.h"
#include "common/json_parse.h"
#include "common/status.h"
#include "common/tokenizer/tokenizer.h"

namespace flotilla::harmony {
namespace {

using Json = nlohmann::ordered_json;
constexpr char kFunctionsPrefix[] = "functions.";
constexpr size_t kFunctionsPrefixLen = sizeof(kFunctionsPrefix) - 1;

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
      std::sscanf(d.c_str(), "%4d-%2d-%2d%c", &y, &m, &day, &tail) != 3 || m < 1 || m > 12 ||
      day < 1) {
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

absl::StatusOr<MappedRequest> MapChatRequest(const Json& request,
                                             const OpenAiRequestOptions& options) {
  FLOTILLA_ASSIGN_OR_RETURN(ChatConversation conversation, ParseChatConversation(request));
  return MapChatRequest(conversation, options);
}

namespace {

// The tools the prompt describes, checked: names of letters, digits, '_'
// and '-', each once, and a schema the renderer can write.
absl::StatusOr<std::vector<ToolDescription>> DescribeTools(const std::vector<ChatTool>& tools) {
  std::vector<ToolDescription> out;
  for (size_t i = 0; i < tools.size(); ++i) {
    const ChatTool& t = tools[i];
    const std::string name_field = t.field + ".name";
    if (t.name.empty()) return Invalid(name_field, "is required");
    FLOTILLA_RETURN_IF_ERROR(tokenizer::CheckUtf8(t.name, name_field));
    for (char c : t.name) {
      if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-')) {
        return Invalid(name_field,
                       absl::StrCat("'", t.name, "' must use only letters, digits, '_' and '-'"));
      }
    }
    for (const ToolDescription& other : out) {
      if (other.name == t.name)
        return Invalid(name_field, absl::StrCat("duplicate tool '", t.name, "'"));
    }
    FLOTILLA_RETURN_IF_ERROR(tokenizer::CheckUtf8(t.description, t.field + ".description"));
    ToolDescription d{t.name, t.description, t.parameters};
    // Render now so that a malformed schema is reported against the request.
    auto rendered = RenderFunctionTool(d);
    if (!rendered.ok())
      return Invalid(absl::StrCat("tools[", i, "]"), std::string(rendered.status().message()));
    out.push_back(std::move(d));
  }
  return out;
}

// tool_choice: the tools the prompt keeps, and the instruction it adds
// (empty: none).
absl::StatusOr<std::string> ApplyToolChoice(const ChatToolChoice& choice,
                                            std::vector<ToolDescription>& tools) {
  switch (choice.mode) {
    case ChatToolChoice::Mode::kAuto:
      return std::string();
    case ChatToolChoice::Mode::kNone:
      tools.clear();
      return std::string();
    case ChatToolChoice::Mode::kRequired:
      if (tools.empty()) return Invalid("tool_choice", "\"required\" but the request has no tools");
      return std::string(
          "You must call one of the functions in the `functions` namespace before answering.");
    case ChatToolChoice::Mode::kFunction:
      break;
  }
  std::erase_if(tools, [&](const ToolDescription& t) { return t.name != choice.function; });
  if (tools.empty()) {
    return Invalid(choice.function_field,
                   absl::StrCat("'", choice.function, "' is not one of the request's tools"));
  }
  return absl::StrCat("You must call the function `functions.", choice.function,
                      "` before answering.");
}

Message AssistantText(const std::string& channel, const std::string& text) {
  Message a;
  a.role = Role::kAssistant;
  a.channel = channel;
  a.content = text;
  return a;
}

// The messages of the conversation after the system and developer ones; the
// system and developer messages' text goes into `instructions`.
absl::StatusOr<std::vector<Message>> MapTurns(const ChatConversation& conversation,
                                              std::vector<std::string>& instructions) {
  const std::vector<ChatMessage>& messages = conversation.messages;
  if (messages.empty()) {
    return Invalid(conversation.messages_field, "is required (a non-empty array)");
  }
  std::vector<Message> turns;
  std::vector<std::pair<std::string, std::string>> calls;  // tool_call id -> function name
  for (const ChatMessage& m : messages) {
    FLOTILLA_RETURN_IF_ERROR(tokenizer::CheckUtf8(m.content, m.ContentField()));
    switch (m.role) {
      case ChatRole::kSystem:
      case ChatRole::kDeveloper:
        if (!m.content.empty()) instructions.push_back(m.content);
        break;
      case ChatRole::kUser: {
        Message u;
        u.role = Role::kUser;
        u.content = m.content;
        turns.push_back(std::move(u));
        break;
      }
      case ChatRole::kAssistant: {
        FLOTILLA_RETURN_IF_ERROR(tokenizer::CheckUtf8(m.reasoning, m.ReasoningField()));
        if (!m.reasoning.empty()) turns.push_back(AssistantText("analysis", m.reasoning));
        if (!m.content.empty()) {
          turns.push_back(AssistantText(m.tool_calls.empty() ? "final" : "commentary", m.content));
        }
        for (size_t k = 0; k < m.tool_calls.size(); ++k) {
          const ChatToolCall& c = m.tool_calls[k];
          const std::string cw = m.ToolCallField(k);
          FLOTILLA_RETURN_IF_ERROR(tokenizer::CheckUtf8(c.id, cw + ".id"));
          FLOTILLA_RETURN_IF_ERROR(tokenizer::CheckUtf8(c.name, cw + ".name"));
          FLOTILLA_RETURN_IF_ERROR(tokenizer::CheckUtf8(c.arguments, cw + ".arguments"));
          Message a = AssistantText("commentary", c.arguments.empty() ? "{}" : c.arguments);
          a.recipient = absl::StrCat(kFunctionsPrefix, c.name);
          a.content_type = "<|constrain|>json";
          turns.push_back(std::move(a));
          calls.emplace_back(c.id, c.name);
        }
        break;
      }
      case ChatRole::kTool: {
        const std::string id_field = m.ToolCallIdField();
        if (m.tool_call_id.empty()) return Invalid(id_field, "is required for a tool message");
        FLOTILLA_RETURN_IF_ERROR(tokenizer::CheckUtf8(m.tool_call_id, id_field));
        std::string name;
        for (const auto& [cid, cname] : calls) {
          if (cid == m.tool_call_id) name = cname;
        }
        if (name.empty()) {
          return Invalid(id_field, absl::StrCat("'", m.tool_call_id,
                                                "' matches no earlier assistant tool call"));
        }
        if (!m.name.empty() && m.name != name) {
          return Invalid(m.field + ".name", absl::StrCat("'", m.name, "' but call '",
                                                         m.tool_call_id, "' was to '", name, "'"));
        }
        Message t;
        t.role = Role::kTool;
        t.name = absl::StrCat(kFunctionsPrefix, name);
        t.recipient = "assistant";
        t.channel = "commentary";
        t.content = m.content;
        turns.push_back(std::move(t));
        break;
      }
    }
  }
  return turns;
}

}  // namespace

absl::StatusOr<MappedRequest> MapChatRequest(const ChatConversation& conversation,
                                             const OpenAiRequestOptions& options) {
  SystemContent system = options.system;
  if (options.date) {
    FLOTILLA_RETURN_IF_ERROR(CheckDate(*options.date));
    system.conversation_start_date = *options.date;
  }
  if (const std::optional<std::string>& effort = conversation.reasoning_effort) {
    if (*effort != "low" && *effort != "medium" && *effort != "high") {
      return Invalid("reasoning_effort",
                     absl::StrCat("must be low, medium or high, not '", *effort, "'"));
    }
    system.reasoning_effort = *effort;
  }
  FLOTILLA_ASSIGN_OR_RETURN(std::vector<ToolDescription> tools, DescribeTools(conversation.tools));
  FLOTILLA_ASSIGN_OR_RETURN(std::string choice_instruction,
                            ApplyToolChoice(conversation.tool_choice, tools));
  std::vector<std::string> instructions;
  FLOTILLA_ASSIGN_OR_RETURN(std::vector<Message> turns, MapTurns(conversation, instructions));

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
  if (event != StreamParser::Event::kContentDelta && event != StreamParser::Event::kMessageEnded)
    return out;
  const std::string& delta = parser.last_content_delta();
  if (delta.empty()) return out;
  const Message& m =
      event == StreamParser::Event::kMessageEnded ? parser.messages().back() : parser.current();
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
