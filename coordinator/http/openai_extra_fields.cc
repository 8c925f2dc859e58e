#include "coordinator/http/openai_extra_fields.h"

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "coordinator/json_fields.h"

namespace flotilla::coordinator {
namespace {

using json_fields::Field;
using json_fields::Invalid;
using Json = nlohmann::ordered_json;

// The longest chat_template_kwargs string this server puts into a system message.
constexpr size_t kMaxKwargBytes = 4096;

absl::StatusOr<std::string> KwargString(const Json& value, const std::string& field) {
  if (!value.is_string()) return Invalid(field, "must be a string");
  const std::string& s = value.get_ref<const std::string&>();
  if (s.size() > kMaxKwargBytes) {
    return Invalid(field, absl::StrCat("must be at most ", kMaxKwargBytes, " bytes"));
  }
  return s;
}

}  // namespace

absl::Status ReadStopTokenFields(const Json& body, int vocab_size,
                                 common::SamplingParams& sampling) {
  if (const Json* ids = Field(body, "stop_token_ids")) {
    if (!ids->is_array()) return Invalid("stop_token_ids", "must be an array of token ids");
    if (ids->size() > kMaxStopTokenIds) {
      return Invalid("stop_token_ids", absl::StrCat("may hold at most ", kMaxStopTokenIds, " ids"));
    }
    for (size_t i = 0; i < ids->size(); ++i) {
      const Json& id = (*ids)[i];
      const std::string where = absl::StrCat("stop_token_ids[", i, "]");
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= vocab_size) {
        return Invalid(where, absl::StrCat("must be a token id of this model's vocabulary (0 to ",
                                           vocab_size - 1, "), not ", id.dump()));
      }
      sampling.add_stop_token_ids(id.get<int32_t>());
    }
  }
  const Json* min = Field(body, "min_tokens");
  if (min == nullptr) return absl::OkStatus();
  if (!min->is_number_integer() || min->get<int64_t>() < 0 || min->get<int64_t>() > UINT32_MAX) {
    return Invalid("min_tokens", absl::StrCat("must be an integer of at least 0, not ", min->dump()));
  }
  const uint32_t min_tokens = min->get<uint32_t>();
  if (sampling.max_tokens() != 0 && min_tokens > sampling.max_tokens()) {
    return Invalid("min_tokens", absl::StrCat("must be at most max_tokens (", sampling.max_tokens(),
                                              "), not ", min_tokens));
  }
  sampling.set_min_tokens(min_tokens);
  return absl::OkStatus();
}

absl::Status ReadChatTemplateKwargs(const Json& body, FieldCheck& fields,
                                    harmony::OpenAiRequestOptions& options) {
  const Json* kwargs = Field(body, "chat_template_kwargs");
  if (kwargs == nullptr) return absl::OkStatus();
  if (!kwargs->is_object()) return Invalid("chat_template_kwargs", "must be an object");
  for (const auto& [key, value] : kwargs->items()) {
    const std::string field = "chat_template_kwargs." + key;
    if (value.is_null()) continue;
    if (key == "reasoning_effort") {
      if (value != "low" && value != "medium" && value != "high") {
        return Invalid(field, absl::StrCat("must be \"low\", \"medium\" or \"high\", not ",
                                           value.dump()));
      }
      options.system.reasoning_effort = value.get<std::string>();
    } else if (key == "model_identity") {
      FLOTILLA_ASSIGN_OR_RETURN(options.system.model_identity, KwargString(value, field));
    } else if (key == "knowledge_cutoff") {
      FLOTILLA_ASSIGN_OR_RETURN(options.system.knowledge_cutoff, KwargString(value, field));
    } else if (key == "conversation_start_date") {
      FLOTILLA_ASSIGN_OR_RETURN(std::string date, KwargString(value, field));
      absl::Status valid = harmony::CheckDate(date);
      if (!valid.ok()) return Invalid(field, std::string(valid.message()));
      options.date = std::move(date);
    } else {
      FLOTILLA_RETURN_IF_ERROR(fields.Unknown(field));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckTextOnly(const Json& body) {
  if (const Json* m = Field(body, "modalities")) {
    if (!m->is_array()) return Invalid("modalities", "must be an array of strings");
    for (size_t i = 0; i < m->size(); ++i) {
      if ((*m)[i] != "text") {
        return Invalid(absl::StrCat("modalities[", i, "]"),
                       absl::StrCat((*m)[i].dump(), " is not supported: this model writes text only"));
      }
    }
  }
  if (Field(body, "audio") != nullptr) {
    return Invalid("audio", "audio output is not supported: this model writes text only");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<Json>> MapLegacyFunctions(const Json& body) {
  const Json* functions = Field(body, "functions");
  const Json* call = Field(body, "function_call");
  if (functions == nullptr && call == nullptr) return std::optional<Json>();
  if (functions != nullptr && Field(body, "tools") != nullptr) {
    return Invalid("functions", "give tools or functions, not both");
  }
  if (call != nullptr && Field(body, "tool_choice") != nullptr) {
    return Invalid("function_call", "give tool_choice or function_call, not both");
  }
  Json out = body;
  out.erase("functions");
  out.erase("function_call");
  if (functions != nullptr) {
    if (!functions->is_array()) return Invalid("functions", "must be an array of functions");
    Json tools = Json::array();
    for (const Json& f : *functions) tools.push_back(Json{{"type", "function"}, {"function", f}});
    out["tools"] = std::move(tools);
  }
  if (call != nullptr) {
    if (call->is_string()) {
      out["tool_choice"] = *call;  // "none" or "auto"; the mapping checks the value
    } else if (call->is_object() && call->contains("name")) {
      out["tool_choice"] = Json{{"type", "function"}, {"function", {{"name", (*call)["name"]}}}};
    } else {
      return Invalid("function_call", "must be \"none\", \"auto\" or {\"name\": NAME}");
    }
  }
  return std::optional<Json>(std::move(out));
}

}  // namespace flotilla::coordinator
