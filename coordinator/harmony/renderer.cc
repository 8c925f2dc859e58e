#include "coordinator/harmony/renderer.h"

#include <cctype>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/status.h"

namespace flotilla::harmony {
namespace {

using Json = nlohmann::ordered_json;
namespace tk = tokenizer;

// Each line of `text` as a `// ` comment at `indent`.
std::string Comment(const std::string& text, const std::string& indent) {
  std::string out;
  for (absl::string_view line : absl::StrSplit(absl::string_view(text.data(), text.size()), '\n')) {
    absl::StrAppend(&out, indent, "// ", line, "\n");
  }
  return out;
}

std::string Literal(const Json& v) { return v.dump(-1, ' ', false, Json::error_handler_t::replace); }

// A default value as gpt-oss expects it: strings bare, everything else as JSON.
std::string DefaultText(const Json& v) { return v.is_string() ? v.get<std::string>() : Literal(v); }

bool IsIdentifier(const std::string& s) {
  if (s.empty() || std::isdigit(static_cast<unsigned char>(s[0]))) return false;
  for (char c : s) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '$')) return false;
  }
  return true;
}

absl::Status Malformed(const std::string& where, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat("malformed tool schema at ", where, ": ", why));
}

absl::StatusOr<std::string> RenderType(const Json& schema, const std::string& where, int depth, int nesting = 0);

// `{` properties `}` of an object schema; the properties sit at `depth`.
// `nesting` counts schema levels, to refuse absurdly deep schemas.
absl::StatusOr<std::string> RenderObject(const Json& schema, const std::string& where, int depth, int nesting = 0) {
  auto props = schema.find("properties");
  if (props != schema.end() && !props->is_object()) return Malformed(where + ".properties", "must be an object");
  std::vector<std::string> required;
  if (auto req = schema.find("required"); req != schema.end()) {
    if (!req->is_array()) return Malformed(where + ".required", "must be an array of property names");
    for (const auto& r : *req) {
      if (!r.is_string()) return Malformed(where + ".required", "must be an array of property names");
      if (props == schema.end() || !props->contains(r.get<std::string>())) {
        return Malformed(where + ".required",
                         absl::StrCat("names '", r.get<std::string>(), "', which is not a property"));
      }
      required.push_back(r.get<std::string>());
    }
  }
  if (props == schema.end() || props->empty()) {
    if (auto ap = schema.find("additionalProperties"); ap != schema.end() && ap->is_object()) {
      FLOTILLA_ASSIGN_OR_RETURN(std::string v, RenderType(*ap, where + ".additionalProperties", depth, nesting + 1));
      return absl::StrCat("{ [key: string]: ", v, " }");
    }
    return std::string("object");
  }
  const std::string indent(2 * depth, ' ');
  std::string out = "{\n";
  for (auto it = props->begin(); it != props->end(); ++it) {
    const std::string pw = absl::StrCat(where, ".properties.", it.key());
    const Json& p = it.value();
    if (!p.is_object() && !p.is_boolean()) return Malformed(pw, "must be a schema object");
    if (p.is_object()) {
      if (auto t = p.find("title"); t != p.end() && t->is_string()) {
        out += Comment(t->get<std::string>(), indent);
      }
      if (auto d = p.find("description"); d != p.end()) {
        if (!d->is_string()) return Malformed(pw + ".description", "must be a string");
        out += Comment(d->get<std::string>(), indent);
      }
      if (auto ex = p.find("examples"); ex != p.end()) {
        if (!ex->is_array()) return Malformed(pw + ".examples", "must be an array");
        std::vector<std::string> items;
        for (const auto& e : *ex) items.push_back(Literal(e));
        if (!items.empty()) {
          out += absl::StrCat(indent, "// ", items.size() == 1 ? "Example: " : "Examples: ",
                              absl::StrJoin(items, ", "), "\n");
        }
      }
    }
    FLOTILLA_ASSIGN_OR_RETURN(std::string type, RenderType(p, pw, depth + 1, nesting + 1));
    const bool is_required =
        std::find(required.begin(), required.end(), it.key()) != required.end();
    const std::string name = IsIdentifier(it.key()) ? it.key() : Literal(Json(it.key()));
    absl::StrAppend(&out, indent, name, is_required ? "" : "?", ": ", type, ",");
    if (p.is_object()) {
      if (auto d = p.find("default"); d != p.end()) absl::StrAppend(&out, " // default: ", DefaultText(*d));
    }
    out += "\n";
  }
  absl::StrAppend(&out, std::string(2 * (depth > 0 ? depth - 1 : 0), ' '), "}");
  return out;
}

absl::StatusOr<std::string> RenderOneType(const std::string& type, const Json& schema,
                                          const std::string& where, int depth, int nesting) {
  if (type == "string") return std::string("string");
  if (type == "number" || type == "integer") return std::string("number");
  if (type == "boolean") return std::string("boolean");
  if (type == "null") return std::string("null");
  if (type == "array") {
    auto items = schema.find("items");
    if (items == schema.end() || items->is_boolean()) return std::string("any[]");
    if (!items->is_object()) return Malformed(where + ".items", "must be a schema object");
    FLOTILLA_ASSIGN_OR_RETURN(std::string item, RenderType(*items, where + ".items", depth, nesting + 1));
    if (item.find(" | ") != std::string::npos && item.find('\n') == std::string::npos) {
      item = absl::StrCat("(", item, ")");
    }
    return absl::StrCat(item, "[]");
  }
  if (type == "object") return RenderObject(schema, where, depth, nesting);
  return Malformed(where + ".type",
                   absl::StrCat("unknown type '", type,
                                "' (expected string, number, integer, boolean, array, object or null)"));
}

absl::StatusOr<std::string> RenderType(const Json& schema, const std::string& where, int depth, int nesting) {
  if (nesting > 32) return Malformed(where, "is nested more than 32 levels deep");
  if (schema.is_boolean()) return std::string("any");
  if (!schema.is_object()) return Malformed(where, "must be a schema object");
  std::string out;
  if (auto r = schema.find("$ref"); r != schema.end()) {
    return Malformed(where + ".$ref", "references are not supported; inline the referenced schema");
  }
  if (auto c = schema.find("const"); c != schema.end()) {
    out = Literal(*c);
  } else if (auto e = schema.find("enum"); e != schema.end()) {
    if (!e->is_array() || e->empty()) return Malformed(where + ".enum", "must be a non-empty array");
    std::vector<std::string> values;
    for (const auto& v : *e) values.push_back(Literal(v));
    out = absl::StrJoin(values, " | ");
  } else if (schema.contains("oneOf") || schema.contains("anyOf")) {
    const char* key = schema.contains("oneOf") ? "oneOf" : "anyOf";
    const Json& variants = schema[key];
    if (!variants.is_array() || variants.empty()) {
      return Malformed(absl::StrCat(where, ".", key), "must be a non-empty array of schemas");
    }
    std::vector<std::string> parts;
    for (size_t i = 0; i < variants.size(); ++i) {
      FLOTILLA_ASSIGN_OR_RETURN(std::string v,
                                RenderType(variants[i], absl::StrCat(where, ".", key, "[", i, "]"), depth, nesting + 1));
      parts.push_back(std::move(v));
    }
    out = absl::StrJoin(parts, " | ");
  } else if (auto t = schema.find("type"); t != schema.end()) {
    if (t->is_string()) {
      FLOTILLA_ASSIGN_OR_RETURN(out, RenderOneType(t->get<std::string>(), schema, where, depth, nesting));
    } else if (t->is_array() && !t->empty()) {
      std::vector<std::string> parts;
      for (const auto& one : *t) {
        if (!one.is_string()) return Malformed(where + ".type", "must be a string or an array of strings");
        FLOTILLA_ASSIGN_OR_RETURN(std::string v, RenderOneType(one.get<std::string>(), schema, where, depth, nesting));
        parts.push_back(std::move(v));
      }
      out = absl::StrJoin(parts, " | ");
    } else {
      return Malformed(where + ".type", "must be a string or a non-empty array of strings");
    }
  } else if (schema.contains("properties")) {
    FLOTILLA_ASSIGN_OR_RETURN(out, RenderObject(schema, where, depth, nesting));
  } else {
    out = "any";
  }
  if (auto n = schema.find("nullable"); n != schema.end() && n->is_boolean() && n->get<bool>()) {
    out += " | null";
  }
  return out;
}

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

std::string RenderNamespace(const std::string& name, const std::string& description,
                            const std::vector<ToolDescription>& tools) {
  std::string out = absl::StrCat("## ", name, "\n\n");
  if (!description.empty()) out += Comment(description, "");
  absl::StrAppend(&out, "namespace ", name, " {\n\n");
  for (const auto& t : tools) {
    // Built-in and validated tools render; a failure here is a bug in the caller.
    auto r = RenderFunctionTool(t);
    absl::StrAppend(&out, r.ok() ? *r : std::string(r.status().message()), "\n\n");
  }
  absl::StrAppend(&out, "} // namespace ", name);
  return out;
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
  if (!tool.description.empty()) out += Comment(tool.description, "");
  std::string params = "()";
  if (tool.parameters) {
    const Json& p = *tool.parameters;
    if (!p.is_object()) return Malformed(where, "must be a JSON Schema object");
    if (auto t = p.find("type"); t != p.end() && !(t->is_string() && *t == "object")) {
      return Malformed(where + ".type", absl::StrCat("must be \"object\", not ", Literal(*t)));
    }
    FLOTILLA_ASSIGN_OR_RETURN(std::string obj, RenderObject(p, where, 0));
    if (obj != "object") params = absl::StrCat("(_: ", obj, ")");
  }
  absl::StrAppend(&out, "type ", tool.name, " = ", params, " => any;");
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
      tools.push_back(RenderNamespace(
          "browser",
          "Web browsing. Every page you open gets a cursor, shown in brackets as `[{cursor}]`.\n"
          "Cite what you use as `【{cursor}†L{line_start}(-L{line_end})?】`, e.g. `【6†L9-L11】`.\n"
          "Quote at most 10 words verbatim from a page.",
          ToolsFromJson(BrowserFunctions())));
    }
    if (s.python_tool) {
      tools.push_back(
          "## python\n\n"
          "Send Python code to this tool to run it in a stateful Jupyter notebook; it replies with "
          "the output, or reports a timeout after 120 seconds. The notebook's /mnt/data folder "
          "keeps files between calls. There is no internet access.");
    }
    blocks.push_back(absl::StrCat("# Tools\n\n", absl::StrJoin(tools, "\n\n")));
  }
  std::string channels;
  if (!s.required_channels.empty()) {
    channels = absl::StrCat("# Valid channels: ", absl::StrJoin(s.required_channels, ", "),
                            ". Channel must be included for every message.");
  }
  if (has_function_tools) {
    if (!channels.empty()) channels += "\n";
    channels += "Calls to these tools must go to the commentary channel: 'functions'.";
  }
  if (!channels.empty()) blocks.push_back(channels);
  return absl::StrJoin(blocks, "\n\n");
}

absl::StatusOr<std::string> RenderDeveloperContent(const DeveloperContent& d) {
  std::vector<std::string> blocks;
  if (d.instructions) blocks.push_back(absl::StrCat("# Instructions\n\n", *d.instructions));
  if (!d.function_tools.empty()) {
    std::string ns = "# Tools\n\n## functions\n\nnamespace functions {\n\n";
    for (const auto& t : d.function_tools) {
      FLOTILLA_ASSIGN_OR_RETURN(std::string decl, RenderFunctionTool(t));
      absl::StrAppend(&ns, decl, "\n\n");
    }
    ns += "} // namespace functions";
    blocks.push_back(std::move(ns));
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
