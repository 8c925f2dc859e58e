#include "coordinator/grpc/chat_request.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/json_parse.h"
#include "common/status.h"
#include "coordinator/chat_prompt.h"
#include "coordinator/http/openai_extra_fields.h"
#include "coordinator/json_fields.h"

namespace flotilla::coordinator {
namespace {

using json_fields::Invalid;

// The most stop strings a request may give (as OpenAI's `stop`).
constexpr int kMaxStopStrings = 4;

absl::Status InRange(const std::string& field, double v, double lo, double hi,
                     bool lo_open = false) {
  if (!std::isfinite(v) || v > hi || (lo_open ? v <= lo : v < lo)) {
    return Invalid(field,
                   absl::StrCat("must be in ", lo_open ? "(" : "[", lo, ", ", hi, "], not ", v));
  }
  return absl::OkStatus();
}

absl::Status CheckLogitBias(const common::SamplingParams& s) {
  if (s.logit_bias_size() > 1024)
    return Invalid("sampling.logit_bias", "may hold at most 1024 entries");
  for (const auto& [token, bias] : s.logit_bias()) {
    const std::string where = absl::StrCat("sampling.logit_bias[", token, "]");
    if (token < 0 || static_cast<tokenizer::TokenId>(token) >= tokenizer::kVocabSize) {
      return Invalid(where, absl::StrCat("token id ", token, " is outside the vocabulary [0, ",
                                         tokenizer::kVocabSize, ")"));
    }
    FLOTILLA_RETURN_IF_ERROR(InRange(where, bias, -100, 100));
  }
  return absl::OkStatus();
}

absl::Status CheckStopTokenIds(const common::SamplingParams& s) {
  if (static_cast<size_t>(s.stop_token_ids_size()) > kMaxStopTokenIds) {
    return Invalid("sampling.stop_token_ids",
                   absl::StrCat("may hold at most ", kMaxStopTokenIds, " ids"));
  }
  for (int i = 0; i < s.stop_token_ids_size(); ++i) {
    const int32_t t = s.stop_token_ids(i);
    if (t < 0 || static_cast<tokenizer::TokenId>(t) >= tokenizer::kVocabSize) {
      return Invalid(absl::StrCat("sampling.stop_token_ids[", i, "]"),
                     absl::StrCat("token id ", t, " is outside the vocabulary [0, ",
                                  tokenizer::kVocabSize, ")"));
    }
  }
  return absl::OkStatus();
}

// Every sampling field a chat may use, in its range.
absl::Status CheckSampling(const common::SamplingParams& s) {
  if (s.has_temperature()) {
    FLOTILLA_RETURN_IF_ERROR(InRange("sampling.temperature", s.temperature(), 0, 2));
  }
  if (s.has_top_p()) {
    FLOTILLA_RETURN_IF_ERROR(InRange("sampling.top_p", s.top_p(), 0, 1, /*lo_open=*/true));
  }
  if (s.top_k() < 0)
    return Invalid("sampling.top_k", absl::StrCat("must be >= 0 (0 = off), not ", s.top_k()));
  FLOTILLA_RETURN_IF_ERROR(InRange("sampling.min_p", s.min_p(), 0, 1));
  FLOTILLA_RETURN_IF_ERROR(InRange("sampling.frequency_penalty", s.frequency_penalty(), -2, 2));
  FLOTILLA_RETURN_IF_ERROR(InRange("sampling.presence_penalty", s.presence_penalty(), -2, 2));
  if (s.has_repetition_penalty()) {
    FLOTILLA_RETURN_IF_ERROR(InRange("sampling.repetition_penalty", s.repetition_penalty(), 0, 2,
                                     /*lo_open=*/true));
  }
  FLOTILLA_RETURN_IF_ERROR(CheckLogitBias(s));
  if (s.has_truncate_prompt_tokens() &&
      (s.truncate_prompt_tokens() == 0 || s.truncate_prompt_tokens() < -1)) {
    return Invalid(
        "sampling.truncate_prompt_tokens",
        absl::StrCat("must be -1 or a positive number, not ", s.truncate_prompt_tokens()));
  }
  if (s.max_tokens() != 0 && s.min_tokens() > s.max_tokens()) {
    return Invalid("sampling.min_tokens", absl::StrCat("must be at most sampling.max_tokens (",
                                                       s.max_tokens(), "), not ", s.min_tokens()));
  }
  if (s.logprobs() > 20) {
    return Invalid("sampling.logprobs", absl::StrCat("must be in [0, 20], not ", s.logprobs()));
  }
  if (s.ignore_eos()) {
    return Invalid("sampling.ignore_eos",
                   "is not allowed for Chat (the reply ends at Harmony's end tokens)");
  }
  return CheckStopTokenIds(s);
}

// The request's sampling as the worker runs it: Harmony's end tokens before
// the request's stop_token_ids; speculative decoding is the server's choice
// for chat.
void ReadSampling(const common::SamplingParams& s, PreparedRequest& out) {
  out.sampling = s;
  out.sampling.clear_speculative();
  out.sampling.clear_stop_token_ids();
  out.sampling.add_stop_token_ids(tokenizer::kReturn);
  out.sampling.add_stop_token_ids(tokenizer::kCall);
  for (int32_t t : s.stop_token_ids()) out.sampling.add_stop_token_ids(t);
  out.logprobs = s.return_logprobs() || s.logprobs() > 0;
  out.top_logprobs = static_cast<int>(s.logprobs());
  out.sampling.set_return_logprobs(out.logprobs);
}

absl::Status ReadStop(const v1::ChatRequest& request, PreparedRequest& out) {
  if (request.stop_size() > kMaxStopStrings) {
    return Invalid("stop", absl::StrCat("may hold at most ", kMaxStopStrings, " strings"));
  }
  for (const std::string& s : request.stop()) {
    if (s.empty()) return Invalid("stop", "stop strings must not be empty");
    FLOTILLA_RETURN_IF_ERROR(tokenizer::CheckUtf8(s, "stop"));
    out.stop.push_back(s);
  }
  return absl::OkStatus();
}

absl::StatusOr<harmony::ChatRole> RoleOf(v1::ChatMessage::Role role, const std::string& where) {
  switch (role) {
    case v1::ChatMessage::SYSTEM:
      return harmony::ChatRole::kSystem;
    case v1::ChatMessage::DEVELOPER:
      return harmony::ChatRole::kDeveloper;
    case v1::ChatMessage::USER:
      return harmony::ChatRole::kUser;
    case v1::ChatMessage::ASSISTANT:
      return harmony::ChatRole::kAssistant;
    case v1::ChatMessage::TOOL:
      return harmony::ChatRole::kTool;
    default:
      return Invalid(where + ".role", "is required (SYSTEM, DEVELOPER, USER, ASSISTANT or TOOL)");
  }
}

absl::StatusOr<harmony::ChatMessage> MessageOf(const v1::ChatMessage& m, const std::string& where) {
  harmony::ChatMessage out;
  out.field = where;
  FLOTILLA_ASSIGN_OR_RETURN(out.role, RoleOf(m.role(), where));
  out.content = m.content();
  const bool assistant = out.role == harmony::ChatRole::kAssistant;
  const bool tool = out.role == harmony::ChatRole::kTool;
  if (!m.reasoning().empty() && !assistant) {
    return Invalid(where + ".reasoning", "is only allowed on ASSISTANT messages");
  }
  out.reasoning = m.reasoning();
  if (!m.tool_calls().empty() && !assistant) {
    return Invalid(where + ".tool_calls", "are only allowed on ASSISTANT messages");
  }
  for (int k = 0; k < m.tool_calls_size(); ++k) {
    const v1::ToolCall& c = m.tool_calls(k);
    const std::string cw = absl::StrCat(where, ".tool_calls[", k, "]");
    if (c.id().empty()) return Invalid(cw + ".id", "is required");
    if (c.name().empty()) return Invalid(cw + ".name", "is required");
    out.tool_calls.push_back({c.id(), c.name(), c.arguments(), /*field=*/""});
  }
  if (!m.tool_call_id().empty() && !tool) {
    return Invalid(where + ".tool_call_id", "is only allowed on TOOL messages");
  }
  if (!m.name().empty() && !tool)
    return Invalid(where + ".name", "is only allowed on TOOL messages");
  if (tool && m.tool_call_id().empty()) {
    return Invalid(where + ".tool_call_id",
                   "is required: the id of the call this is the result of");
  }
  out.tool_call_id = m.tool_call_id();
  out.name = m.name();
  return out;
}

absl::StatusOr<harmony::ChatTool> ToolOf(const v1::Tool& t, const std::string& where) {
  harmony::ChatTool out;
  out.name = t.name();
  out.description = t.description();
  out.strict = t.strict();
  out.field = where;
  out.parameters_field = where + ".parameters_json";
  if (!t.parameters_json().empty()) {
    absl::StatusOr<nlohmann::ordered_json> p =
        ParseJson<nlohmann::ordered_json>(t.parameters_json(), "the schema");
    if (!p.ok()) return Invalid(out.parameters_field, std::string(p.status().message()));
    if (!p->is_object()) return Invalid(out.parameters_field, "must be a JSON Schema object");
    out.parameters = *std::move(p);
  }
  return out;
}

absl::StatusOr<harmony::ChatToolChoice> ToolChoiceOf(const v1::ToolChoice& tc) {
  harmony::ChatToolChoice out;
  out.function_field = "tool_choice.function";
  if (tc.mode() != v1::ToolChoice::FUNCTION && !tc.function().empty()) {
    return Invalid("tool_choice.function", "is only used with mode FUNCTION");
  }
  switch (tc.mode()) {
    case v1::ToolChoice::AUTO:
      out.mode = harmony::ChatToolChoice::Mode::kAuto;
      return out;
    case v1::ToolChoice::NONE:
      out.mode = harmony::ChatToolChoice::Mode::kNone;
      return out;
    case v1::ToolChoice::REQUIRED:
      out.mode = harmony::ChatToolChoice::Mode::kRequired;
      return out;
    case v1::ToolChoice::FUNCTION:
      if (tc.function().empty()) {
        return Invalid("tool_choice.function", "is required with mode FUNCTION");
      }
      out.mode = harmony::ChatToolChoice::Mode::kFunction;
      out.function = tc.function();
      return out;
    default:
      return Invalid("tool_choice.mode",
                     absl::StrCat("unknown mode ", static_cast<int>(tc.mode())));
  }
}

absl::StatusOr<std::optional<std::string>> ReasoningEffortOf(v1::ReasoningEffort effort) {
  switch (effort) {
    case v1::REASONING_EFFORT_UNSPECIFIED:
      return std::optional<std::string>();
    case v1::LOW:
      return std::optional<std::string>("low");
    case v1::MEDIUM:
      return std::optional<std::string>("medium");
    case v1::HIGH:
      return std::optional<std::string>("high");
    default:
      return Invalid("reasoning_effort", absl::StrCat("unknown value ", static_cast<int>(effort)));
  }
}

// response_format: the schema text is parsed here; what the schema may
// contain is the constraint's to check (naming the same field).
absl::StatusOr<std::optional<harmony::ChatResponseFormat>> ResponseFormatOf(
    const v1::ChatRequest& request) {
  if (!request.has_response_format()) return std::optional<harmony::ChatResponseFormat>();
  const v1::ResponseFormat& format = request.response_format();
  harmony::ChatResponseFormat out;
  if (format.type() != v1::ResponseFormat::JSON_SCHEMA && format.has_json_schema()) {
    return Invalid("response_format.json_schema", "is only used with type JSON_SCHEMA");
  }
  switch (format.type()) {
    case v1::ResponseFormat::TEXT:
      out.type = harmony::ChatResponseFormat::Type::kText;
      return std::optional(std::move(out));
    case v1::ResponseFormat::JSON_OBJECT:
      out.type = harmony::ChatResponseFormat::Type::kJsonObject;
      return std::optional(std::move(out));
    case v1::ResponseFormat::JSON_SCHEMA:
      break;
    default:
      return Invalid("response_format.type",
                     absl::StrCat("unknown type ", static_cast<int>(format.type())));
  }
  out.type = harmony::ChatResponseFormat::Type::kJsonSchema;
  out.schema_field = "response_format.json_schema.schema_json";
  const std::string& text = format.json_schema().schema_json();
  if (text.empty()) {
    return Invalid(out.schema_field,
                   "is required with type JSON_SCHEMA (a JSON Schema object as JSON text)");
  }
  absl::StatusOr<nlohmann::ordered_json> schema =
      ParseJson<nlohmann::ordered_json>(text, "the schema");
  if (!schema.ok()) return Invalid(out.schema_field, std::string(schema.status().message()));
  if (!schema->is_object()) return Invalid(out.schema_field, "must be a JSON Schema object");
  out.schema = *std::move(schema);
  return std::optional(std::move(out));
}

}  // namespace

absl::StatusOr<harmony::ChatConversation> ChatConversationOf(const v1::ChatRequest& request) {
  harmony::ChatConversation out;
  if (request.messages().empty()) return Invalid("messages", "is required (at least one message)");
  for (int i = 0; i < request.messages_size(); ++i) {
    FLOTILLA_ASSIGN_OR_RETURN(harmony::ChatMessage m,
                              MessageOf(request.messages(i), absl::StrCat("messages[", i, "]")));
    out.messages.push_back(std::move(m));
  }
  for (int i = 0; i < request.tools_size(); ++i) {
    FLOTILLA_ASSIGN_OR_RETURN(harmony::ChatTool t,
                              ToolOf(request.tools(i), absl::StrCat("tools[", i, "]")));
    out.tools.push_back(std::move(t));
  }
  FLOTILLA_ASSIGN_OR_RETURN(out.tool_choice, ToolChoiceOf(request.tool_choice()));
  FLOTILLA_ASSIGN_OR_RETURN(out.reasoning_effort, ReasoningEffortOf(request.reasoning_effort()));
  FLOTILLA_ASSIGN_OR_RETURN(out.response_format, ResponseFormatOf(request));
  return out;
}

absl::StatusOr<PreparedRequest> PrepareChat(const v1::ChatRequest& request,
                                            std::string_view model_id,
                                            const tokenizer::Tokenizer& tok,
                                            const harmony::OpenAiRequestOptions& options,
                                            size_t max_prompt_text_bytes) {
  if (!request.model().empty() && request.model() != model_id) {
    return absl::NotFoundError(absl::StrCat("model: the model '", request.model(),
                                            "' does not exist; this server serves '",
                                            std::string(model_id), "'"));
  }
  if (request.n() > static_cast<uint32_t>(kMaxChoices)) {
    return Invalid("n", absl::StrCat("must be at most ", kMaxChoices, ", not ", request.n()));
  }
  FLOTILLA_ASSIGN_OR_RETURN(harmony::ChatConversation conversation, ChatConversationOf(request));
  FLOTILLA_RETURN_IF_ERROR(CheckSampling(request.sampling()));
  PreparedRequest out;
  out.endpoint = Endpoint::kChat;
  out.n = std::max<uint32_t>(request.n(), 1);
  ReadSampling(request.sampling(), out);
  FLOTILLA_RETURN_IF_ERROR(ReadStop(request, out));
  FLOTILLA_RETURN_IF_ERROR(
      PrepareChatPrompt(conversation, options, tok, max_prompt_text_bytes, out));
  return out;
}

}  // namespace flotilla::coordinator
