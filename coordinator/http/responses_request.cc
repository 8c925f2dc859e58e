#include "coordinator/http/responses_request.h"

#include <algorithm>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "coordinator/http/request_fields.h"
#include "coordinator/http/responses_items.h"
#include "coordinator/json_fields.h"

namespace flotilla::coordinator {
namespace {

using json_fields::Invalid;
using json_fields::Field;
using json_fields::RequiredString;

// Request fields the chat pipeline reads under the same name and meaning.
constexpr const char* kSameInChat[] = {"model",
                                       "temperature",
                                       "top_p",
                                       "seed",
                                       "top_k",
                                       "min_p",
                                       "repetition_penalty",
                                       "logit_bias",
                                       "frequency_penalty",
                                       "presence_penalty",
                                       "cache_salt",
                                       "stop_token_ids",
                                       "min_tokens",
                                       "chat_template_kwargs"};
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
    return Invalid("max_tool_calls", "must be an integer of at least 1 (a response makes at most one call)");
  }
  if (Field(body, "prompt") != nullptr) {
    return Invalid("prompt", "is not supported: this server stores no prompt templates");
  }
  FLOTILLA_RETURN_IF_ERROR(CheckOptionalType(body, "background", &Json::is_boolean, "true or false"));
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
        return Invalid(absl::StrCat("include[", i, "]"),
                       absl::StrCat((*v)[i].dump(), " is not supported (only \"",
                                    kEncryptedReasoning, "\"; reasoning text is always in the "
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

absl::StatusOr<Json> ChatTools(const Json& tools) {
  if (!tools.is_array()) return Invalid("tools", "must be an array");
  Json out = Json::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string where = absl::StrCat("tools[", i, "]");
    const Json& tool = tools[i];
    if (!tool.is_object()) return Invalid(where, "must be an object");
    FLOTILLA_ASSIGN_OR_RETURN(std::string type, RequiredString(tool, "type", where));
    if (type != "function") {
      return Invalid(where + ".type", absl::StrCat("tool type '", type,
                                                   "' is not supported (only \"function\" tools)"));
    }
    FLOTILLA_ASSIGN_OR_RETURN(std::string name, RequiredString(tool, "name", where));
    Json fn{{"name", name}};
    if (const Json* d = Field(tool, "description")) fn["description"] = *d;
    if (const Json* p = Field(tool, "parameters")) fn["parameters"] = *p;
    // The Responses API's default: arguments conform to the parameters.
    const Json* strict = Field(tool, "strict");
    fn["strict"] = strict == nullptr ? Json(true) : *strict;
    out.push_back(Json{{"type", "function"}, {"function", std::move(fn)}});
  }
  return out;
}

absl::StatusOr<Json> ChatToolChoice(const Json& choice) {
  if (choice.is_string()) return choice;  // none, auto, required: the chat mapping checks
  if (!choice.is_object()) return Invalid("tool_choice", "must be a string or an object");
  FLOTILLA_ASSIGN_OR_RETURN(std::string type, RequiredString(choice, "type", "tool_choice"));
  if (type != "function") {
    return Invalid("tool_choice.type",
                   absl::StrCat("'", type, "' is not supported (only \"function\")"));
  }
  FLOTILLA_ASSIGN_OR_RETURN(std::string name, RequiredString(choice, "name", "tool_choice"));
  return Json{{"type", "function"}, {"function", {{"name", name}}}};
}

absl::Status ChatReasoning(const Json& reasoning, Json& chat) {
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
      chat["reasoning_effort"] = value;
    } else if (key == "summary" || key == "generate_summary") {
      // A no-op: no summaries are written; the whole reasoning is the item's content.
      if (!value.is_null() && value != "auto" && value != "concise" && value != "detailed") {
        return Invalid("reasoning." + key, "must be \"auto\", \"concise\" or \"detailed\"");
      }
    }  // other members: CheckUnsupported reported them
  }
  return absl::OkStatus();
}

absl::Status ChatTextFormat(const Json& text, Json& chat) {
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
  if (type != "json_schema") {
    // text and json_object mean the same in the chat pipeline, which checks the type.
    chat["response_format"] = Json{{"type", type}};
    return absl::OkStatus();
  }
  Json schema{{"name", format->value("name", "response")}};
  if (const Json* s = Field(*format, "schema")) schema["schema"] = *s;
  if (const Json* s = Field(*format, "strict")) schema["strict"] = *s;
  chat["response_format"] = Json{{"type", "json_schema"}, {"json_schema", std::move(schema)}};
  return absl::OkStatus();
}

// The chat body and, per chat message, where it came from.
struct ChatBody {
  Json body;
  std::vector<std::string> origin;
};

absl::StatusOr<ChatBody> Translate(const ResponsesRequest& request, const Json& history) {
  const Json& r = request.body;
  ChatBody out;
  out.body = Json::object();
  for (const char* key : kSameInChat) {
    if (const Json* v = Field(r, key)) out.body[key] = *v;
  }
  if (const Json* v = Field(r, "max_output_tokens")) out.body["max_completion_tokens"] = *v;
  out.body["stream"] = request.stream;
  if (const Json* v = Field(r, "tools")) {
    FLOTILLA_ASSIGN_OR_RETURN(out.body["tools"], ChatTools(*v));
  }
  if (const Json* v = Field(r, "tool_choice")) {
    FLOTILLA_ASSIGN_OR_RETURN(out.body["tool_choice"], ChatToolChoice(*v));
  }
  if (const Json* v = Field(r, "reasoning")) FLOTILLA_RETURN_IF_ERROR(ChatReasoning(*v, out.body));
  if (const Json* v = Field(r, "text")) FLOTILLA_RETURN_IF_ERROR(ChatTextFormat(*v, out.body));

  Json messages = Json::array();
  if (const Json* v = Field(r, "instructions"); v != nullptr && !v->get<std::string>().empty()) {
    messages.push_back(Json{{"role", "developer"}, {"content", *v}});
    out.origin.push_back("instructions");
  }
  ChatMessageBuilder items(&messages, &out.origin, request.cipher);
  for (const Json& item : history) {
    FLOTILLA_RETURN_IF_ERROR(items.Add(item, "previous_response_id"));
  }
  for (size_t i = 0; i < request.input_items.size(); ++i) {
    FLOTILLA_RETURN_IF_ERROR(items.Add(request.input_items[i], absl::StrCat("input[", i, "]")));
  }
  items.Flush();
  out.body["messages"] = std::move(messages);
  return out;
}

// "response_format.json_schema.schema" -> "text.format.schema", and so on.
std::string RenameField(const std::string& field, const std::vector<std::string>& origin) {
  struct Prefix {
    const char* chat;
    const char* responses;
  };
  static constexpr Prefix kPrefixes[] = {
      {"response_format.json_schema", "text.format"}, {"response_format", "text.format"},
      {"max_completion_tokens", "max_output_tokens"}, {"reasoning_effort", "reasoning.effort"},
      {"tool_choice.function", "tool_choice"},        {"messages", "input"}};
  if (absl::StartsWith(field, "messages[")) {
    const size_t close = field.find(']');
    size_t index = 0;
    if (close != std::string::npos && absl::SimpleAtoi(field.substr(9, close - 9), &index) &&
        index < origin.size()) {
      std::string rest = field.substr(close + 1);
      if (rest == ".tool_call_id") rest = ".call_id";
      // An item of the history or the instructions: name the field that brought it.
      return absl::StartsWith(origin[index], "input[") ? origin[index] + rest : origin[index];
    }
  }
  if (absl::StartsWith(field, "tools[")) {
    const size_t fn = field.find("].function");
    if (fn != std::string::npos) return field.substr(0, fn + 1) + field.substr(fn + 10);
  }
  for (const Prefix& p : kPrefixes) {
    if (absl::StartsWith(field, p.chat))
      return p.responses + field.substr(std::string(p.chat).size());
  }
  return field;
}

absl::Status RenameError(const absl::Status& status, const std::vector<std::string>& origin) {
  if (status.ok()) return status;
  const std::string message(status.message());
  const size_t colon = message.find(": ");
  if (colon == std::string::npos || message.substr(0, colon).find(' ') != std::string::npos)
    return status;
  absl::Status renamed(status.code(), absl::StrCat(RenameField(message.substr(0, colon), origin),
                                                   message.substr(colon)));
  status.ForEachPayload(
      [&](absl::string_view url, const absl::Cord& payload) { renamed.SetPayload(url, payload); });
  return renamed;
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
  FLOTILLA_RETURN_IF_ERROR(Translate(out, Json::array()).status());
  return out;
}

absl::StatusOr<Json> ResponsesToChatBody(const ResponsesRequest& request, const Json& history) {
  FLOTILLA_ASSIGN_OR_RETURN(ChatBody chat, Translate(request, history));
  return std::move(chat.body);
}

absl::StatusOr<PreparedRequest> PrepareResponsesRequest(
    const ResponsesRequest& request, const Json& history, std::string_view model_id,
    const tokenizer::Tokenizer& tok, const harmony::OpenAiRequestOptions& options,
    size_t max_prompt_text_bytes) {
  FLOTILLA_ASSIGN_OR_RETURN(ChatBody chat, Translate(request, history));
  absl::StatusOr<PreparedRequest> prepared = PrepareChatRequest(
      chat.body, model_id, tok, options, max_prompt_text_bytes, request.unknown_fields);
  if (!prepared.ok()) return RenameError(prepared.status(), chat.origin);
  // The Responses fields ignored, then chat_template_kwargs' members.
  prepared->ignored_fields.insert(prepared->ignored_fields.begin(),
                                  request.ignored_fields.begin(), request.ignored_fields.end());
  return prepared;
}

Json ResponseSettings(const ResponsesRequest& request) {
  const Json& r = request.body;
  auto get = [&](const char* key, Json fallback) {
    const Json* v = Field(r, key);
    return v == nullptr ? fallback : *v;
  };
  Json tools = Json::array();
  if (absl::StatusOr<Json> chat = ChatTools(get("tools", Json::array())); chat.ok()) {
    for (const Json& t : *chat) {
      Json flat{{"type", "function"}, {"name", t["function"]["name"]}};
      flat["description"] = t["function"].value("description", Json());
      flat["parameters"] = t["function"].value("parameters", Json());
      flat["strict"] = t["function"]["strict"];
      tools.push_back(std::move(flat));
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
