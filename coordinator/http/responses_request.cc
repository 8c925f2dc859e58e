#include "coordinator/http/responses_request.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/harmony/chat_request.h"
#include "common/status.h"
#include "coordinator/chat_prompt.h"
#include "coordinator/http/openai_extra_fields.h"
#include "coordinator/http/request_fields.h"
#include "coordinator/http/responses_items.h"
#include "coordinator/json_fields.h"

namespace flotilla::coordinator {
namespace {

using json_fields::Field;
using json_fields::Invalid;
using json_fields::RequiredString;

// The members of `reasoning`, `text` and `stream_options` known here.
constexpr const char* kReasoningFields[] = {"effort", "summary", "generate_summary"};
constexpr const char* kTextFields[] = {"format", "verbosity"};
constexpr const char* kResponsesStreamOptions[] = {"include_obfuscation"};
// The one `include` value acted on: reasoning items carry encrypted_content.
constexpr const char* kEncryptedReasoning = "reasoning.encrypted_content";

absl::Status CheckOptionalType(const Json& body, const char* key, bool (Json::*is)() const noexcept,
                               const char* what) {
  const Json* v = Field(body, key);
  if (v != nullptr && !(v->*is)()) return Invalid(key, absl::StrCat("must be ", what));
  return absl::OkStatus();
}

// Fields whose value asks for what this server cannot do: a 400 naming
// them. Fields it does not know: `fields` ignores or refuses them
// (request_fields.h).
absl::Status CheckUnsupported(const Json& body, FieldCheck& fields) {
  FLOTILLA_RETURN_IF_ERROR(fields.Check(body, ResponsesFields()));
  for (const auto& [key, known] :
       {std::pair<const char*, absl::Span<const char* const>>{"reasoning", kReasoningFields},
        {"text", kTextFields},
        {"stream_options", kResponsesStreamOptions}}) {
    const Json* v = Field(body, key);
    if (v == nullptr) continue;
    if (!v->is_object()) return Invalid(key, "must be an object");
    FLOTILLA_RETURN_IF_ERROR(fields.Check(*v, known, absl::StrCat(key, ".")));
  }
  if (Field(body, "conversation") != nullptr) {
    return Invalid("conversation",
                   "is not supported (no Conversations API here): continue with "
                   "previous_response_id");
  }
  // gpt-oss ends its turn at a function call: a response holds at most one.
  if (const Json* v = Field(body, "max_tool_calls");
      v != nullptr && !(v->is_number_integer() && v->get<int64_t>() >= 1)) {
    return Invalid("max_tool_calls",
                   "must be an integer of at least 1 (a response makes at most one call)");
  }
  if (Field(body, "prompt") != nullptr) {
    return Invalid("prompt", "is not supported: this server stores no prompt templates");
  }
  FLOTILLA_RETURN_IF_ERROR(
      CheckOptionalType(body, "background", &Json::is_boolean, "true or false"));
  if (const Json* v = Field(body, "background"); v != nullptr && v->get<bool>()) {
    if (const Json* store = Field(body, "store"); store != nullptr && *store == false) {
      return Invalid("background",
                     "true needs store: true (a background response is fetched with GET "
                     "/v1/responses/{id})");
    }
  }
  if (const Json* v = Field(body, "include"); v != nullptr) {
    if (!v->is_array()) return Invalid("include", "must be an array");
    for (size_t i = 0; i < v->size(); ++i) {
      if ((*v)[i] != kEncryptedReasoning) {
        return Invalid(
            absl::StrCat("include[", i, "]"),
            absl::StrCat((*v)[i].dump(), " is not supported (only \"", kEncryptedReasoning,
                         "\"; reasoning text is always in the "
                         "reasoning items)"));
      }
    }
  }
  if (const Json* v = Field(body, "truncation"); v != nullptr && *v != "disabled") {
    return Invalid("truncation",
                   "only \"disabled\" is supported (a conversation longer than the "
                   "context is a context_length_exceeded error)");
  }
  FLOTILLA_RETURN_IF_ERROR(CheckOptionalType(body, "service_tier", &Json::is_string, "a string"));
  if (const Json* v = Field(body, "top_logprobs"); v != nullptr && *v != 0) {
    return Invalid("top_logprobs", "is not supported on /v1/responses (use /v1/chat/completions)");
  }
  for (const char* key :
       {"user", "safety_identifier", "prompt_cache_key", "instructions", "previous_response_id"}) {
    FLOTILLA_RETURN_IF_ERROR(CheckOptionalType(body, key, &Json::is_string, "a string"));
  }
  for (const char* key : {"stream", "store", "parallel_tool_calls"}) {
    FLOTILLA_RETURN_IF_ERROR(CheckOptionalType(body, key, &Json::is_boolean, "true or false"));
  }
  if (const Json* m = Field(body, "metadata"); m != nullptr) {
    if (!m->is_object() || m->size() > 16)
      return Invalid("metadata", "must be an object of at most 16 strings");
    for (const auto& [key, value] : m->items()) {
      if (!value.is_string()) return Invalid(absl::StrCat("metadata.", key), "must be a string");
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Json> InputItems(const Json& body) {
  const Json* input = Field(body, "input");
  if (input == nullptr) return Invalid("input", "is required (a string or an array of items)");
  if (input->is_string()) {
    return Json::array({Json{{"type", "message"}, {"role", "user"}, {"content", *input}}});
  }
  if (!input->is_array()) return Invalid("input", "must be a string or an array of items");
  if (input->empty() && Field(body, "previous_response_id") == nullptr) {
    return Invalid("input", "must not be empty");
  }
  return *input;
}

// ---- tools, tool_choice, reasoning, text ----

absl::Status ReadTools(const Json& tools, harmony::ChatConversation& out) {
  if (!tools.is_array()) return Invalid("tools", "must be an array");
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string where = absl::StrCat("tools[", i, "]");
    const Json& tool = tools[i];
    if (!tool.is_object()) return Invalid(where, "must be an object");
    FLOTILLA_ASSIGN_OR_RETURN(std::string type, RequiredString(tool, "type", where));
    if (type != "function") {
      return Invalid(where + ".type", absl::StrCat("tool type '", type,
                                                   "' is not supported (only \"function\" tools)"));
    }
    harmony::ChatTool t;
    t.field = where;
    t.parameters_field = where + ".parameters";
    FLOTILLA_ASSIGN_OR_RETURN(t.name, RequiredString(tool, "name", where));
    if (const Json* d = Field(tool, "description")) {
      if (!d->is_string()) return Invalid(where + ".description", "must be a string");
      t.description = d->get<std::string>();
    }
    if (const Json* p = Field(tool, "parameters")) t.parameters = *p;
    // The Responses API's default: arguments conform to the parameters.
    t.strict = true;
    if (const Json* strict = Field(tool, "strict")) {
      if (!strict->is_boolean()) return Invalid(where + ".strict", "must be a boolean");
      t.strict = strict->get<bool>();
    }
    out.tools.push_back(std::move(t));
  }
  return absl::OkStatus();
}

absl::Status ReadToolChoice(const Json& choice, harmony::ChatToolChoice& out) {
  using Mode = harmony::ChatToolChoice::Mode;
  if (choice.is_string()) {
    const std::string mode = choice.get<std::string>();
    if (mode == "none") {
      out.mode = Mode::kNone;
    } else if (mode == "required") {
      out.mode = Mode::kRequired;
    } else if (mode != "auto") {
      return Invalid("tool_choice", absl::StrCat("must be \"none\", \"auto\", \"required\" "
                                                 "or a function, not '",
                                                 mode, "'"));
    }
    return absl::OkStatus();
  }
  if (!choice.is_object()) return Invalid("tool_choice", "must be a string or an object");
  FLOTILLA_ASSIGN_OR_RETURN(std::string type, RequiredString(choice, "type", "tool_choice"));
  if (type != "function") {
    return Invalid("tool_choice.type",
                   absl::StrCat("'", type, "' is not supported (only \"function\")"));
  }
  out.mode = Mode::kFunction;
  FLOTILLA_ASSIGN_OR_RETURN(out.function, RequiredString(choice, "name", "tool_choice"));
  out.function_field = "tool_choice.name";
  return absl::OkStatus();
}

absl::Status ReadReasoning(const Json& reasoning, harmony::ChatConversation& out) {
  if (!reasoning.is_object()) return Invalid("reasoning", "must be an object");
  for (const auto& [key, value] : reasoning.items()) {
    if (key == "effort") {
      if (value.is_null()) continue;
      if (value != "low" && value != "medium" && value != "high") {
        return Invalid("reasoning.effort",
                       absl::StrCat("must be \"low\", \"medium\" or \"high\" (what "
                                    "gpt-oss knows), not ",
                                    value.dump()));
      }
      out.reasoning_effort = value.get<std::string>();
    } else if (key == "summary" || key == "generate_summary") {
      // A no-op: no summaries are written; the whole reasoning is the item's content.
      if (!value.is_null() && value != "auto" && value != "concise" && value != "detailed") {
        return Invalid("reasoning." + key, "must be \"auto\", \"concise\" or \"detailed\"");
      }
    }  // other members: CheckUnsupported reported them
  }
  return absl::OkStatus();
}

absl::Status ReadTextFormat(const Json& text, harmony::ChatConversation& out) {
  using Type = harmony::ChatResponseFormat::Type;
  if (!text.is_object()) return Invalid("text", "must be an object");
  for (const auto& [key, value] : text.items()) {
    // verbosity: a no-op (gpt-oss has no such setting); other members:
    // CheckUnsupported reported them.
    if (key == "verbosity" && !value.is_null() && value != "low" && value != "medium" &&
        value != "high") {
      return Invalid("text.verbosity", "must be \"low\", \"medium\" or \"high\"");
    }
  }
  const Json* format = Field(text, "format");
  if (format == nullptr) return absl::OkStatus();
  if (!format->is_object()) return Invalid("text.format", "must be an object");
  FLOTILLA_ASSIGN_OR_RETURN(std::string type, RequiredString(*format, "type", "text.format"));
  harmony::ChatResponseFormat f;
  if (type == "text") {
    f.type = Type::kText;
  } else if (type == "json_object") {
    f.type = Type::kJsonObject;
  } else if (type == "json_schema") {
    f.type = Type::kJsonSchema;
    const Json* schema = Field(*format, "schema");
    if (schema == nullptr || !schema->is_object()) {
      return Invalid("text.format.schema", "is required (a JSON Schema object)");
    }
    if (const Json* strict = Field(*format, "strict"); strict != nullptr && !strict->is_boolean()) {
      return Invalid("text.format.strict", "must be a boolean");
    }
    f.schema = *schema;
    f.schema_field = "text.format.schema";
  } else {
    return Invalid(
        "text.format.type",
        absl::StrCat("must be \"text\", \"json_object\" or \"json_schema\", not '", type, "'"));
  }
  out.response_format = std::move(f);
  return absl::OkStatus();
}

// The typed conversation of `request` continuing `history` (the items of
// previous_response_id): the instructions, then the history's items, then
// the input's, each message naming the Responses field it came from.
absl::StatusOr<harmony::ChatConversation> Conversation(const ResponsesRequest& request,
                                                       const Json& history) {
  const Json& r = request.body;
  harmony::ChatConversation out;
  out.messages_field = "input";
  if (const Json* v = Field(r, "tools")) FLOTILLA_RETURN_IF_ERROR(ReadTools(*v, out));
  if (const Json* v = Field(r, "tool_choice")) {
    FLOTILLA_RETURN_IF_ERROR(ReadToolChoice(*v, out.tool_choice));
  }
  if (const Json* v = Field(r, "reasoning")) FLOTILLA_RETURN_IF_ERROR(ReadReasoning(*v, out));
  if (const Json* v = Field(r, "text")) FLOTILLA_RETURN_IF_ERROR(ReadTextFormat(*v, out));

  if (const Json* v = Field(r, "instructions"); v != nullptr && !v->get<std::string>().empty()) {
    harmony::ChatMessage m;
    m.role = harmony::ChatRole::kDeveloper;
    m.content = v->get<std::string>();
    m.field = m.content_field = "instructions";
    out.messages.push_back(std::move(m));
  }
  ChatMessageBuilder items(&out.messages, request.cipher);
  for (const Json& item : history) {
    FLOTILLA_RETURN_IF_ERROR(
        items.Add(item, "previous_response_id", ChatMessageBuilder::Naming::kWholeItem));
  }
  for (size_t i = 0; i < request.input_items.size(); ++i) {
    FLOTILLA_RETURN_IF_ERROR(items.Add(request.input_items[i], absl::StrCat("input[", i, "]")));
  }
  items.Flush();
  return out;
}

}  // namespace

absl::StatusOr<ResponsesRequest> ParseResponsesRequest(const Json& body,
                                                       const ReasoningCipher* cipher,
                                                       UnknownFields unknown_fields) {
  if (!body.is_object())
    return absl::InvalidArgumentError("the request body must be a JSON object");
  FieldCheck fields(unknown_fields);
  FLOTILLA_RETURN_IF_ERROR(CheckUnsupported(body, fields));
  ResponsesRequest out;
  out.unknown_fields = unknown_fields;
  out.ignored_fields = fields.ignored();
  out.body = body;
  out.cipher = cipher;
  FLOTILLA_ASSIGN_OR_RETURN(out.input_items, InputItems(body));
  if (const Json* v = Field(body, "previous_response_id"))
    out.previous_response_id = v->get<std::string>();
  if (const Json* v = Field(body, "store")) out.store = v->get<bool>();
  if (const Json* v = Field(body, "stream")) out.stream = v->get<bool>();
  if (const Json* v = Field(body, "background")) out.background = v->get<bool>();
  if (const Json* v = Field(body, "include")) {
    out.encrypted_reasoning = std::find(v->begin(), v->end(), kEncryptedReasoning) != v->end();
  }
  // Everything but the conversation's coherence (which needs the history) now.
  FLOTILLA_RETURN_IF_ERROR(Conversation(out, Json::array()).status());
  return out;
}

absl::StatusOr<PreparedRequest> PrepareResponsesRequest(
    const ResponsesRequest& request, const Json& history, std::string_view model_id,
    const tokenizer::Tokenizer& tok, const harmony::OpenAiRequestOptions& options,
    size_t max_prompt_text_bytes) {
  const Json& body = request.body;
  PreparedRequest out;
  out.endpoint = Endpoint::kChat;
  out.stream = request.stream;
  FieldCheck fields(request.unknown_fields);
  FLOTILLA_RETURN_IF_ERROR(json_fields::CheckModel(body, model_id));
  FLOTILLA_RETURN_IF_ERROR(ReadSamplingFields(body, out));
  FLOTILLA_RETURN_IF_ERROR(ReadMaxTokens(body, "max_output_tokens", out).status());
  FLOTILLA_RETURN_IF_ERROR(ReadChatEndTokens(body, tok.vocab_size(), out));
  harmony::OpenAiRequestOptions harmony_options = options;
  FLOTILLA_RETURN_IF_ERROR(ReadChatTemplateKwargs(body, fields, harmony_options));
  FLOTILLA_ASSIGN_OR_RETURN(harmony::ChatConversation conversation, Conversation(request, history));
  FLOTILLA_RETURN_IF_ERROR(
      PrepareChatPrompt(conversation, harmony_options, tok, max_prompt_text_bytes, out));
  // The Responses fields ignored, then chat_template_kwargs' members.
  out.ignored_fields = request.ignored_fields;
  for (const std::string& name : fields.ignored()) out.ignored_fields.push_back(name);
  return out;
}

Json ResponseSettings(const ResponsesRequest& request) {
  const Json& r = request.body;
  auto get = [&](const char* key, Json fallback) {
    const Json* v = Field(r, key);
    return v == nullptr ? fallback : *v;
  };
  Json tools = Json::array();
  harmony::ChatConversation described;
  if (ReadTools(get("tools", Json::array()), described).ok()) {
    for (const harmony::ChatTool& t : described.tools) {
      tools.push_back(Json{{"type", "function"},
                           {"name", t.name},
                           {"description", t.description.empty() ? Json() : Json(t.description)},
                           {"parameters", t.parameters ? Json(*t.parameters) : Json()},
                           {"strict", t.strict}});
    }
  }
  Json reasoning = get("reasoning", Json::object());
  Json settings;
  settings["instructions"] = get("instructions", nullptr);
  settings["max_output_tokens"] = get("max_output_tokens", nullptr);
  settings["metadata"] = get("metadata", Json::object());
  settings["parallel_tool_calls"] = get("parallel_tool_calls", true);
  settings["previous_response_id"] = get("previous_response_id", nullptr);
  settings["reasoning"] = Json{{"effort", reasoning.value("effort", Json())},
                               {"summary", reasoning.value("summary", Json())}};
  settings["store"] = request.store;
  settings["temperature"] = get("temperature", 1.0);
  Json text = get("text", Json::object());
  settings["text"] = Json{{"format", text.value("format", Json{{"type", "text"}})}};
  settings["tool_choice"] = get("tool_choice", "auto");
  settings["tools"] = std::move(tools);
  settings["top_p"] = get("top_p", 1.0);
  settings["truncation"] = "disabled";
  settings["background"] = request.background;
  settings["service_tier"] = "default";
  if (const Json* user = Field(r, "user")) settings["user"] = *user;
  return settings;
}

}  // namespace flotilla::coordinator
