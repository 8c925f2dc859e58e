#include "common/harmony/renderer.h"

#include <cctype>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/harmony/errors.h"
#include "common/harmony/tool_schema.h"
#include "common/status.h"

namespace flotilla::harmony {
namespace {

using Json = nlohmann::ordered_json;
namespace tk = tokenizer;

// The built-in tools, described in our own words; their functions follow the
// shapes gpt-oss was trained to call.
Json BrowserFunctions() {
  return Json::parse(R"([
    {"name": "search", "description": "Search the web for `query` and show the top `topn` results.",
     "parameters": {"type": "object", "properties": {
       "query": {"type": "string"},
       "topn": {"type": "number", "default": 10},
       "source": {"type": "string"}}, "required": ["query"]}},
    {"name": "open", "description": "Open a link id or URL from the page at `cursor` (default: the latest) and show it from line `loc`.\nWith a numeric `id` it follows that link on the page; with a string it opens that URL.",
     "parameters": {"type": "object", "properties": {
       "id": {"type": ["number", "string"], "default": -1},
       "cursor": {"type": "number", "default": -1},
       "loc": {"type": "number", "default": -1},
       "num_lines": {"type": "number", "default": -1},
       "view_source": {"type": "boolean", "default": false},
       "source": {"type": "string"}}}},
    {"name": "find", "description": "Find the exact text `pattern` in the page at `cursor` (default: the latest).",
     "parameters": {"type": "object", "properties": {
       "pattern": {"type": "string"},
       "cursor": {"type": "number", "default": -1}}, "required": ["pattern"]}}
  ])");
}

// The built-in tools' namespace descriptions, in our own words.
constexpr char kBrowserDescription[] =
    "Web browsing. Every page you open gets a cursor, shown in brackets as `[{cursor}]`.\n"
    "Cite what you use as `【{cursor}†L{line_start}(-L{line_end})?】`, e.g. `【6†L9-L11】`.\n"
    "Quote at most 10 words verbatim from a page.\n"
    "sources=web (default: web)";
constexpr char kPythonDescription[] =
    "Send Python code to this tool to run it in a stateful Jupyter notebook; it replies with "
    "the output, or reports a timeout after 120 seconds. The notebook's /mnt/data folder "
    "keeps files between calls. There is no internet access.";

// A tool namespace laid out as the reference does: "## NAME", the
// description (as comments when the namespace declares functions, else as
// plain text), then `namespace NAME { ... }` with one declaration per tool.
std::string RenderNamespace(const std::string& name, const std::string& description,
                            const std::vector<ToolDescription>& tools) {
  std::vector<std::string> lines = {absl::StrCat("## ", name, "\n")};
  for (const auto& line : DescriptionLines(description)) lines.push_back(tools.empty() ? line : "// " + line);
  if (!tools.empty()) {
    lines.push_back(absl::StrCat("namespace ", name, " {\n"));
    for (const auto& t : tools) {
      // Built-in and validated tools render; a failure here is a bug in the caller.
      auto r = RenderFunctionTool(t);
      lines.push_back(absl::StrCat(r.ok() ? *r : std::string(r.status().message()), "\n"));
    }
    lines.push_back(absl::StrCat("} // namespace ", name));
  }
  return absl::StrJoin(lines, "\n");
}

std::vector<ToolDescription> ToolsFromJson(const Json& arr) {
  std::vector<ToolDescription> out;
  for (const auto& t : arr) {
    out.push_back({t["name"].get<std::string>(), t["description"].get<std::string>(), t["parameters"]});
  }
  return out;
}

}  // namespace

void RenderedPrompt::AddText(std::string text) {
  if (text.empty()) return;
  if (!segments_.empty() && !segments_.back().special) {
    segments_.back().text += text;
    return;
  }
  segments_.push_back({false, 0, std::move(text)});
}

std::string RenderedPrompt::Text() const {
  std::string out;
  for (const auto& s : segments_) out += s.text;
  return out;
}

std::vector<tk::TokenId> RenderedPrompt::Tokens(const tk::Tokenizer& tok) const {
  std::vector<tk::TokenId> out;
  for (const auto& s : segments_) {
    if (s.special) {
      out.push_back(s.id);
    } else {
      tok.EncodeOrdinaryInto(s.text, out);
    }
  }
  return out;
}

absl::StatusOr<std::string> RenderFunctionTool(const ToolDescription& tool) {
  const std::string where = absl::StrCat("function '", tool.name, "' parameters");
  std::string out;
  for (const auto& line : DescriptionLines(tool.description)) absl::StrAppend(&out, "// ", line, "\n");
  std::string params;
  if (tool.parameters) {
    const Json& p = *tool.parameters;
    if (!p.is_object()) return MalformedToolSchema(where, "must be a JSON Schema object");
    if (auto t = p.find("type"); t != p.end() && !(t->is_string() && *t == "object")) {
      return MalformedToolSchema(where + ".type",
                                 absl::StrCat("must be \"object\", not ", t->dump()));
    }
    FLOTILLA_ASSIGN_OR_RETURN(Json prepared, PrepareToolSchema(p, where));
    params = absl::StrCat("_: ", SchemaToTypeScript(prepared, ""));
  }
  absl::StrAppend(&out, "type ", tool.name, " = (", params, ") => any;");
  return out;
}

std::string RenderSystemContent(const SystemContent& s, bool has_function_tools) {
  std::vector<std::string> blocks;
  std::vector<std::string> header;
  if (s.model_identity) header.push_back(*s.model_identity);
  if (s.knowledge_cutoff) header.push_back(absl::StrCat("Knowledge cutoff: ", *s.knowledge_cutoff));
  if (s.conversation_start_date) header.push_back(absl::StrCat("Current date: ", *s.conversation_start_date));
  if (!header.empty()) blocks.push_back(absl::StrJoin(header, "\n"));
  if (s.reasoning_effort) blocks.push_back(absl::StrCat("Reasoning: ", *s.reasoning_effort));
  if (s.browser_tool || s.python_tool) {
    std::vector<std::string> tools;
    if (s.browser_tool) {
      tools.push_back(RenderNamespace("browser", kBrowserDescription, ToolsFromJson(BrowserFunctions())));
    }
    if (s.python_tool) tools.push_back(RenderNamespace("python", kPythonDescription, {}));
    blocks.push_back(absl::StrCat("# Tools\n\n", absl::StrJoin(tools, "\n\n")));
  }
  // As in the reference, the line about function calls belongs to the
  // channels block and is left out with it.
  if (!s.required_channels.empty()) {
    std::string channels = absl::StrCat("# Valid channels: ", absl::StrJoin(s.required_channels, ", "),
                                        ". Channel must be included for every message.");
    if (has_function_tools) channels += "\nCalls to these tools must go to the commentary channel: 'functions'.";
    blocks.push_back(std::move(channels));
  }
  return absl::StrJoin(blocks, "\n\n");
}

absl::StatusOr<std::string> RenderDeveloperContent(const DeveloperContent& d) {
  std::vector<std::string> blocks;
  if (d.instructions) blocks.push_back(absl::StrCat("# Instructions\n\n", *d.instructions));
  if (!d.function_tools.empty()) {
    for (const auto& t : d.function_tools) FLOTILLA_RETURN_IF_ERROR(RenderFunctionTool(t).status());
    blocks.push_back(absl::StrCat("# Tools\n\n", RenderNamespace("functions", "", d.function_tools)));
  }
  return absl::StrJoin(blocks, "\n\n");
}

absl::Status RenderMessage(const Message& m, bool has_function_tools, RenderedPrompt& out) {
  auto check_word = [](const std::string& v, const char* what) -> absl::Status {
    for (char c : v) {
      if (std::isspace(static_cast<unsigned char>(c)) || c == '<') {
        return absl::InvalidArgumentError(
            absl::StrCat("message ", what, " '", v, "' must be one word without '<'"));
      }
    }
    return absl::OkStatus();
  };
  FLOTILLA_RETURN_IF_ERROR(check_word(m.recipient, "recipient"));
  FLOTILLA_RETURN_IF_ERROR(check_word(m.channel, "channel"));
  if (m.role == Role::kTool) {
    if (m.name.empty()) {
      return absl::InvalidArgumentError("a tool message needs the tool's name (e.g. functions.get_weather)");
    }
    FLOTILLA_RETURN_IF_ERROR(check_word(m.name, "tool name"));
  }
  out.AddSpecial(tk::kStart, "<|start|>");
  out.AddText(m.role == Role::kTool ? m.name : RoleName(m.role));
  if (!m.recipient.empty()) out.AddText(absl::StrCat(" to=", m.recipient));
  if (!m.channel.empty()) {
    out.AddSpecial(tk::kChannel, "<|channel|>");
    out.AddText(m.channel);
  }
  if (!m.content_type.empty()) {
    static constexpr std::string_view kConstrainName = "<|constrain|>";
    std::string_view ct = m.content_type;
    out.AddText(" ");
    if (ct.substr(0, kConstrainName.size()) == kConstrainName) {
      out.AddSpecial(tk::kConstrain, "<|constrain|>");
      ct.remove_prefix(kConstrainName.size());
    }
    FLOTILLA_RETURN_IF_ERROR(check_word(std::string(ct), "content type"));
    out.AddText(std::string(ct));
  }
  out.AddSpecial(tk::kMessage, "<|message|>");
  if (m.role == Role::kSystem) {
    out.AddText(RenderSystemContent(m.system.value_or(SystemContent()), has_function_tools));
  } else if (m.role == Role::kDeveloper && m.developer) {
    FLOTILLA_ASSIGN_OR_RETURN(std::string text, RenderDeveloperContent(*m.developer));
    out.AddText(std::move(text));
  } else {
    out.AddText(m.content);
  }
  if (m.role == Role::kAssistant && !m.recipient.empty()) {
    out.AddSpecial(tk::kCall, "<|call|>");
  } else {
    out.AddSpecial(tk::kEnd, "<|end|>");
  }
  return absl::OkStatus();
}

absl::StatusOr<RenderedPrompt> RenderConversation(const std::vector<Message>& conversation,
                                                  const RenderOptions& options) {
  bool has_function_tools = false;
  for (const auto& m : conversation) {
    if (m.role == Role::kDeveloper && m.developer && !m.developer->function_tools.empty()) {
      has_function_tools = true;
    }
  }
  size_t last_final = 0;
  bool any_final = false;
  for (size_t i = 0; i < conversation.size(); ++i) {
    if (conversation[i].role == Role::kAssistant && conversation[i].channel == "final") {
      last_final = i;
      any_final = true;
    }
  }
  RenderedPrompt out;
  for (size_t i = 0; i < conversation.size(); ++i) {
    const Message& m = conversation[i];
    if (options.auto_drop_analysis && any_final && i < last_final && m.channel == "analysis") continue;
    absl::Status st = RenderMessage(m, has_function_tools, out);
    if (!st.ok()) return absl::InvalidArgumentError(absl::StrCat("conversation[", i, "]: ", st.message()));
  }
  return out;
}

absl::StatusOr<RenderedPrompt> RenderForCompletion(const std::vector<Message>& conversation,
                                                   const RenderOptions& options) {
  FLOTILLA_ASSIGN_OR_RETURN(RenderedPrompt out, RenderConversation(conversation, options));
  out.AddSpecial(tk::kStart, "<|start|>");
  out.AddText("assistant");
  return out;
}

}  // namespace flotilla::harmony
