#include "coordinator/grpc/chat_pipeline.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <regex>

#include "absl/strings/str_cat.h"
#include "common/json_parse.h"
#include "common/proto_enum_name.h"
#include "common/status.h"
#include "coordinator/json_fields.h"

namespace flotilla::coordinator {
namespace {

using json_fields::Invalid;

absl::Status InRange(const std::string& field, double v, double lo, double hi,
                     bool lo_open = false) {
  if (!std::isfinite(v) || v > hi || (lo_open ? v <= lo : v < lo)) {
    return Invalid(field,
                   absl::StrCat("must be in ", lo_open ? "(" : "[", lo, ", ", hi, "], not ", v));
  }
  return absl::OkStatus();
}

// The sampling fields: checked here so that errors name the proto fields.
absl::Status SamplingToOpenAi(const common::SamplingParams& s, Json& body) {
  if (s.has_temperature()) {
    FLOTILLA_RETURN_IF_ERROR(InRange("sampling.temperature", s.temperature(), 0, 2));
    body["temperature"] = s.temperature();
  }
  if (s.has_top_p()) {
    FLOTILLA_RETURN_IF_ERROR(InRange("sampling.top_p", s.top_p(), 0, 1, /*lo_open=*/true));
    body["top_p"] = s.top_p();
  }
  if (s.top_k() < 0)
    return Invalid("sampling.top_k", absl::StrCat("must be >= 0 (0 = off), not ", s.top_k()));
  FLOTILLA_RETURN_IF_ERROR(InRange("sampling.min_p", s.min_p(), 0, 1));
  FLOTILLA_RETURN_IF_ERROR(InRange("sampling.frequency_penalty", s.frequency_penalty(), -2, 2));
  FLOTILLA_RETURN_IF_ERROR(InRange("sampling.presence_penalty", s.presence_penalty(), -2, 2));
  if (s.frequency_penalty() != 0) body["frequency_penalty"] = s.frequency_penalty();
  if (s.presence_penalty() != 0) body["presence_penalty"] = s.presence_penalty();
  if (s.top_k() > 0) body["top_k"] = s.top_k();
  if (s.min_p() != 0) body["min_p"] = s.min_p();
  if (s.has_repetition_penalty()) {
    FLOTILLA_RETURN_IF_ERROR(InRange("sampling.repetition_penalty", s.repetition_penalty(), 0, 2,
                                     /*lo_open=*/true));
    body["repetition_penalty"] = s.repetition_penalty();
  }
  for (const auto& [token, bias] : s.logit_bias()) {
    body["logit_bias"][absl::StrCat(token)] = bias;
  }
  if (s.has_seed()) body["seed"] = static_cast<int64_t>(s.seed());
  if (s.max_tokens() != 0) body["max_tokens"] = s.max_tokens();
  if (s.has_truncate_prompt_tokens()) body["truncate_prompt_tokens"] = s.truncate_prompt_tokens();
  if (s.logprobs() > 20) {
    return Invalid("sampling.logprobs", absl::StrCat("must be in [0, 20], not ", s.logprobs()));
  }
  if (s.return_logprobs() || s.logprobs() > 0) {
    body["logprobs"] = true;
    if (s.logprobs() > 0) body["top_logprobs"] = s.logprobs();
  }
  if (s.ignore_eos()) {
    return Invalid("sampling.ignore_eos",
                   "is not allowed for Chat (the reply ends at Harmony's end tokens)");
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

// response_format: the schema text is parsed here so that its errors name
// the proto field; what the schema may contain is the constraint's to check.
absl::Status ResponseFormatToOpenAi(const v1::ChatRequest& request, Json& body) {
  if (!request.has_response_format()) return absl::OkStatus();
  const v1::ResponseFormat& format = request.response_format();
  const bool with_schema = format.type() == v1::ResponseFormat::JSON_SCHEMA;
  if (!with_schema && format.has_json_schema()) {
    return Invalid("response_format.json_schema", "is only used with type JSON_SCHEMA");
  }
  switch (format.type()) {
    case v1::ResponseFormat::TEXT:
      body["response_format"] = Json{{"type", "text"}};
      return absl::OkStatus();
    case v1::ResponseFormat::JSON_OBJECT:
      body["response_format"] = Json{{"type", "json_object"}};
      return absl::OkStatus();
    case v1::ResponseFormat::JSON_SCHEMA:
      break;
    default:
      return Invalid("response_format.type",
                     absl::StrCat("unknown type ", static_cast<int>(format.type())));
  }
  const v1::ResponseFormat::JsonSchema& js = format.json_schema();
  if (js.schema_json().empty()) {
    return Invalid("response_format.json_schema.schema_json",
                   "is required with type JSON_SCHEMA (a JSON Schema object as JSON text)");
  }
  absl::StatusOr<Json> parsed = ParseJson<Json>(js.schema_json(), "the schema");
  if (!parsed.ok())
    return Invalid("response_format.json_schema.schema_json", std::string(parsed.status().message()));
  Json schema = *std::move(parsed);
  if (!schema.is_object())
    return Invalid("response_format.json_schema.schema_json", "must be a JSON Schema object");
  Json out = Json{{"name", js.name().empty() ? "response" : js.name()},
                  {"schema", std::move(schema)},
                  {"strict", js.strict()}};
  if (!js.description().empty()) out["description"] = js.description();
  body["response_format"] = Json{{"type", "json_schema"}, {"json_schema", std::move(out)}};
  return absl::OkStatus();
}

// The OpenAI body's field names in an error of PrepareChatRequest, as the
// ChatRequest fields they came from.
absl::Status ToProtoFieldNames(const absl::Status& status) {
  if (status.ok() || status.code() != absl::StatusCode::kInvalidArgument) return status;
  std::string message(status.message());
  static const std::regex kToolParams(R"(^tools\[(\d+)\]\.function\.(parameters|strict))");
  message = std::regex_replace(message, kToolParams, "tools[$1].$2",
                               std::regex_constants::format_first_only);
  const std::string schema = "response_format.json_schema.schema:";
  if (message.rfind(schema, 0) == 0) {
    message = "response_format.json_schema.schema_json:" + message.substr(schema.size());
  }
  if (message.rfind("tools[", 0) == 0) {
    const size_t dot = message.find("].parameters:");
    if (dot != std::string::npos) message.replace(dot, 13, "].parameters_json:");
  }
  return absl::InvalidArgumentError(message);
}

}  // namespace

absl::StatusOr<Json> ChatRequestToOpenAi(const v1::ChatRequest& request,
                                         std::string_view model_id) {
  Json body = Json::object();
  body["model"] = request.model().empty() ? std::string(model_id) : request.model();
  if (request.n() > 1) body["n"] = request.n();
  if (request.messages().empty()) return Invalid("messages", "is required (at least one message)");
  Json messages = Json::array();
  std::vector<std::pair<std::string, std::string>> calls;  // id -> name, for TOOL messages
  for (int i = 0; i < request.messages_size(); ++i) {
    const v1::ChatMessage& m = request.messages(i);
    const std::string where = absl::StrCat("messages[", i, "]");
    const std::optional<std::string> role = LowerCaseEnumName(m.role());
    if (!role.has_value()) {
      return Invalid(where + ".role", "is required (SYSTEM, DEVELOPER, USER, ASSISTANT or TOOL)");
    }
    Json j;
    j["role"] = *role;
    j["content"] = m.content();
    const bool assistant = m.role() == v1::ChatMessage::ASSISTANT;
    const bool tool = m.role() == v1::ChatMessage::TOOL;
    if (!m.reasoning().empty()) {
      if (!assistant) return Invalid(where + ".reasoning", "is only allowed on ASSISTANT messages");
      j["reasoning_content"] = m.reasoning();
    }
    if (!m.tool_calls().empty()) {
      if (!assistant)
        return Invalid(where + ".tool_calls", "are only allowed on ASSISTANT messages");
      Json tcs = Json::array();
      for (int k = 0; k < m.tool_calls_size(); ++k) {
        const v1::ToolCall& c = m.tool_calls(k);
        const std::string cw = absl::StrCat(where, ".tool_calls[", k, "]");
        if (c.id().empty()) return Invalid(cw + ".id", "is required");
        if (c.name().empty()) return Invalid(cw + ".name", "is required");
        tcs.push_back(Json{{"id", c.id()},
                           {"type", "function"},
                           {"function", {{"name", c.name()}, {"arguments", c.arguments()}}}});
        calls.emplace_back(c.id(), c.name());
      }
      j["tool_calls"] = std::move(tcs);
    }
    if (!m.tool_call_id().empty() && !tool) {
      return Invalid(where + ".tool_call_id", "is only allowed on TOOL messages");
    }
    if (!m.name().empty() && !tool)
      return Invalid(where + ".name", "is only allowed on TOOL messages");
    if (tool) {
      if (m.tool_call_id().empty()) {
        return Invalid(where + ".tool_call_id",
                       "is required: the id of the call this is the result of");
      }
      if (!m.name().empty()) {
        for (const auto& [id, name] : calls) {
          if (id == m.tool_call_id() && name != m.name()) {
            return Invalid(where + ".name", absl::StrCat("'", m.name(), "' but call '", id,
                                                         "' was to '", name, "'"));
          }
        }
      }
      j["tool_call_id"] = m.tool_call_id();
    }
    messages.push_back(std::move(j));
  }
  body["messages"] = std::move(messages);

  if (!request.tools().empty()) {
    Json tools = Json::array();
    for (int i = 0; i < request.tools_size(); ++i) {
      const v1::Tool& t = request.tools(i);
      const std::string where = absl::StrCat("tools[", i, "]");
      Json fn;
      fn["name"] = t.name();
      if (!t.description().empty()) fn["description"] = t.description();
      if (!t.parameters_json().empty()) {
        absl::StatusOr<Json> p = ParseJson<Json>(t.parameters_json(), "the schema");
        if (!p.ok()) return Invalid(where + ".parameters_json", std::string(p.status().message()));
        if (!p->is_object())
          return Invalid(where + ".parameters_json", "must be a JSON Schema object");
        fn["parameters"] = *std::move(p);
      }
      if (t.strict()) fn["strict"] = true;
      tools.push_back(Json{{"type", "function"}, {"function", std::move(fn)}});
    }
    body["tools"] = std::move(tools);
  }
  const v1::ToolChoice& tc = request.tool_choice();
  if (tc.mode() != v1::ToolChoice::FUNCTION && !tc.function().empty()) {
    return Invalid("tool_choice.function", "is only used with mode FUNCTION");
  }
  switch (tc.mode()) {
    case v1::ToolChoice::AUTO:
      break;
    case v1::ToolChoice::NONE:
      body["tool_choice"] = "none";
      break;
    case v1::ToolChoice::REQUIRED:
      body["tool_choice"] = "required";
      break;
    case v1::ToolChoice::FUNCTION:
      if (tc.function().empty())
        return Invalid("tool_choice.function", "is required with mode FUNCTION");
      body["tool_choice"] = Json{{"type", "function"}, {"function", {{"name", tc.function()}}}};
      break;
    default:
      return Invalid("tool_choice.mode",
                     absl::StrCat("unknown mode ", static_cast<int>(tc.mode())));
  }
  switch (request.reasoning_effort()) {
    case v1::REASONING_EFFORT_UNSPECIFIED:
      break;
    case v1::LOW:
      body["reasoning_effort"] = "low";
      break;
    case v1::MEDIUM:
      body["reasoning_effort"] = "medium";
      break;
    case v1::HIGH:
      body["reasoning_effort"] = "high";
      break;
    default:
      return Invalid("reasoning_effort",
                     absl::StrCat("unknown value ", static_cast<int>(request.reasoning_effort())));
  }
  FLOTILLA_RETURN_IF_ERROR(SamplingToOpenAi(request.sampling(), body));
  FLOTILLA_RETURN_IF_ERROR(ResponseFormatToOpenAi(request, body));
  if (!request.stop().empty()) {
    Json stop = Json::array();
    for (const std::string& s : request.stop()) stop.push_back(s);
    body["stop"] = std::move(stop);
  }
  return body;
}

absl::StatusOr<PreparedRequest> PrepareChat(const v1::ChatRequest& request,
                                            std::string_view model_id,
                                            const tokenizer::Tokenizer& tok,
                                            const harmony::OpenAiRequestOptions& options,
                                            size_t max_prompt_text_bytes) {
  FLOTILLA_ASSIGN_OR_RETURN(Json body, ChatRequestToOpenAi(request, model_id));
  absl::StatusOr<PreparedRequest> openai =
      PrepareChatRequest(body, model_id, tok, options, max_prompt_text_bytes);
  if (!openai.ok()) return ToProtoFieldNames(openai.status());
  PreparedRequest prepared = *std::move(openai);
  const common::SamplingParams& s = request.sampling();
  prepared.sampling.set_top_k(s.top_k());
  prepared.sampling.set_min_p(s.min_p());
  for (int32_t t : s.stop_token_ids()) prepared.sampling.add_stop_token_ids(t);
  return prepared;
}

v1::ChatResponse::FinishReason ChatFinishReason(std::string_view r) {
  if (r == "stop") return v1::ChatResponse::STOP;
  if (r == "length") return v1::ChatResponse::LENGTH;
  if (r == "tool_calls") return v1::ChatResponse::TOOL_CALLS;
  return v1::ChatResponse::FINISH_REASON_UNSPECIFIED;
}

// ---- ChatStream ----

ChatStream::ChatStream(const tokenizer::Tokenizer* tokenizer, std::string request_id,
                       std::string call_id_seed, std::vector<std::string> stop,
                       uint32_t prompt_tokens, bool return_token_ids, uint32_t choices)
    : request_id_(std::move(request_id)),
      prompt_tokens_(prompt_tokens),
      decoder_(tokenizer, Decoding::kHarmony, 0, std::move(call_id_seed), std::move(stop)),
      return_token_ids_(return_token_ids),
      choices_(std::max<uint32_t>(choices, 1)) {}

v1::ChatResponse ChatStream::Begin() const {
  v1::ChatResponse r;
  r.set_request_id(request_id_);
  return r;
}

namespace {

// Adjacent text on the same channel goes into one delta.
void AppendText(bool reasoning, const std::string& text, v1::ChatResponse& out) {
  if (text.empty()) return;
  if (out.deltas_size() > 0) {
    v1::ChatDelta* last = out.mutable_deltas(out.deltas_size() - 1);
    if (reasoning && last->has_reasoning()) {
      last->mutable_reasoning()->append(text);
      return;
    }
    if (!reasoning && last->has_content()) {
      last->mutable_content()->append(text);
      return;
    }
  }
  v1::ChatDelta* delta = out.add_deltas();
  if (reasoning) {
    delta->set_reasoning(text);
  } else {
    delta->set_content(text);
  }
}

// A call's later argument pieces join its last delta.
void AppendToolCall(const ToolCallPiece& piece, v1::ChatResponse& out) {
  if (out.deltas_size() > 0 && piece.id.empty() && piece.name.empty()) {
    v1::ChatDelta* last = out.mutable_deltas(out.deltas_size() - 1);
    if (last->has_tool_call() && last->tool_call().index() == piece.index) {
      last->mutable_tool_call()->mutable_arguments()->append(piece.arguments);
      return;
    }
  }
  if (piece.id.empty() && piece.name.empty() && piece.arguments.empty()) return;
  v1::ToolCallDelta* call = out.add_deltas()->mutable_tool_call();
  call->set_index(piece.index);
  call->set_id(piece.id);
  call->set_name(piece.name);
  call->set_arguments(piece.arguments);
}

}  // namespace

void ChatStream::SetEnd(v1::ChatResponse& out, v1::ChatResponse::FinishReason reason,
                        uint32_t prompt_tokens, uint32_t completion_tokens) {
  if (++choices_finished_ >= choices_) finished_ = true;
  out.set_finish_reason(reason);
  out.mutable_usage()->set_prompt_tokens(prompt_tokens);
  out.mutable_usage()->set_completion_tokens(completion_tokens);
}

bool ChatStream::HasNews(const v1::ChatResponse& r) {
  return r.finish_reason() != v1::ChatResponse::FINISH_REASON_UNSPECIFIED ||
         !r.deltas().empty() || !r.logprobs().empty() || !r.token_ids().empty();
}

std::vector<v1::ChatResponse> ChatStream::Consume(const std::vector<RequestEvent>& events) {
  if (finished_) return {};
  // One message per choice the batch speaks of, in the order they first appear.
  std::vector<v1::ChatResponse> out;
  std::vector<int> slot(choices_, -1);
  auto message = [&](uint32_t choice) -> v1::ChatResponse& {
    if (slot[choice] < 0) {
      slot[choice] = static_cast<int>(out.size());
      out.emplace_back().set_request_id(request_id_);
      out.back().set_index(choice);
    }
    return out[static_cast<size_t>(slot[choice])];
  };
  for (const RequestEvent& e : events) {
    if (e.choice >= choices_) continue;
    switch (e.kind) {
      case RequestEvent::Kind::kTokens: {
        if (e.update == nullptr) break;
        v1::ChatResponse& r = message(e.choice);
        tokens_seen_ += static_cast<uint32_t>(e.update->token_ids_size());
        r.mutable_logprobs()->MergeFrom(e.update->logprobs());
        if (return_token_ids_) {
          r.mutable_token_ids()->MergeFrom(e.update->token_ids());
          if (e.update->has_stop_token()) r.add_token_ids(e.update->stop_token());
        }
        break;
      }
      case RequestEvent::Kind::kReasoning:
      case RequestEvent::Kind::kContent:
        AppendText(e.kind == RequestEvent::Kind::kReasoning, e.text, message(e.choice));
        break;
      case RequestEvent::Kind::kToolCall:
        AppendToolCall(e.tool_call, message(e.choice));
        break;
      case RequestEvent::Kind::kMessageStart:
      case RequestEvent::Kind::kMessageEnd:
        break;  // the deltas say their channel; messages are not shown
      case RequestEvent::Kind::kFinish:
        SetEnd(message(e.choice), ChatFinishReason(e.finish_reason), e.usage.prompt_tokens,
               e.usage.completion_tokens);
        break;
      case RequestEvent::Kind::kUsage:
      case RequestEvent::Kind::kError:
        break;  // the caller ends the stream
    }
  }
  std::vector<v1::ChatResponse> news;
  for (v1::ChatResponse& r : out) {
    if (HasNews(r)) news.push_back(std::move(r));
  }
  return news;
}

std::optional<v1::ChatResponse> ChatStream::Feed(const cluster::SequenceUpdate& u) {
  if (finished_ || u.finish_reason() == common::ERROR) return std::nullopt;
  std::vector<RequestEvent> events(1);
  events[0].kind = RequestEvent::Kind::kTokens;
  events[0].update = &u;
  std::vector<tokenizer::TokenId> ids(u.token_ids().begin(), u.token_ids().end());
  decoder_.Feed(ids, events);
  const uint32_t seen = tokens_seen_ + static_cast<uint32_t>(u.token_ids_size());
  if (decoder_.stopped_by_string()) {
    decoder_.Finish(common::STOP, std::nullopt, TokenUsage{prompt_tokens_, seen}, events);
  } else if (u.finish_reason() != common::FINISH_REASON_UNSPECIFIED) {
    std::optional<tokenizer::TokenId> stop;
    if (u.has_stop_token()) stop = static_cast<tokenizer::TokenId>(u.stop_token());
    const uint32_t prompt = u.prompt_tokens() ? u.prompt_tokens() : prompt_tokens_;
    decoder_.Finish(u.finish_reason(), stop, TokenUsage{prompt, u.completion_tokens()}, events);
  }
  std::vector<v1::ChatResponse> out = Consume(events);
  if (out.empty()) return std::nullopt;
  return std::move(out.front());
}

v1::ChatResponse ChatStream::Cancelled() {
  v1::ChatResponse r;
  r.set_request_id(request_id_);
  if (!finished_) {
    finished_ = true;
    r.set_finish_reason(v1::ChatResponse::CANCELLED);
    r.mutable_usage()->set_prompt_tokens(prompt_tokens_);
    r.mutable_usage()->set_completion_tokens(tokens_seen_);
  }
  return r;
}

}  // namespace flotilla::coordinator
