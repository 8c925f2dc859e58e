#include "coordinator/http/openai_pipeline.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/json_parse.h"
#include "common/status.h"
#include "coordinator/chat_prompt.h"
#include "coordinator/http/openai_extra_fields.h"
#include "coordinator/http/request_fields.h"
#include "coordinator/input_limits.h"
#include "coordinator/json_fields.h"
#include "coordinator/stop_filter.h"

namespace flotilla::coordinator {
namespace {

using json_fields::CheckModel;
using json_fields::Field;
using json_fields::Invalid;

absl::StatusOr<std::optional<double>> Number(const Json& body, const char* key, double lo,
                                             double hi) {
  const Json* v = Field(body, key);
  if (v == nullptr) return std::optional<double>();
  if (!v->is_number()) return Invalid(key, "must be a number");
  const double d = v->get<double>();
  if (!std::isfinite(d) || d < lo || d > hi) {
    return Invalid(key, absl::StrCat("must be between ", lo, " and ", hi, ", not ", d));
  }
  return std::optional<double>(d);
}

absl::StatusOr<std::optional<int64_t>> Integer(const Json& body, const char* key, int64_t lo,
                                               int64_t hi) {
  const Json* v = Field(body, key);
  if (v == nullptr) return std::optional<int64_t>();
  if (!v->is_number_integer()) return Invalid(key, "must be an integer");
  int64_t i;
  if (v->is_number_unsigned()) {
    const uint64_t u = v->get<uint64_t>();
    if (u > static_cast<uint64_t>(hi)) return Invalid(key, absl::StrCat("must be at most ", hi));
    i = static_cast<int64_t>(u);
  } else {
    i = v->get<int64_t>();
  }
  if (i < lo || i > hi)
    return Invalid(key, absl::StrCat("must be between ", lo, " and ", hi, ", not ", i));
  return std::optional<int64_t>(i);
}

absl::StatusOr<bool> Bool(const Json& body, const char* key) {
  const Json* v = Field(body, key);
  if (v == nullptr) return false;
  if (!v->is_boolean()) return Invalid(key, "must be true or false");
  return v->get<bool>();
}

// top_k, min_p and repetition_penalty (as vLLM accepts them) and OpenAI's
// logit_bias (token id as a string -> bias in [-100, 100]).
absl::Status ExtraSamplingFields(const Json& body, common::SamplingParams& s) {
  FLOTILLA_ASSIGN_OR_RETURN(std::optional<int64_t> k, Integer(body, "top_k", -1, INT32_MAX));
  if (k && *k > 0) s.set_top_k(static_cast<int32_t>(*k));  // -1 and 0: off
  FLOTILLA_ASSIGN_OR_RETURN(std::optional<double> min_p, Number(body, "min_p", 0, 1));
  if (min_p) s.set_min_p(static_cast<float>(*min_p));
  FLOTILLA_ASSIGN_OR_RETURN(std::optional<double> rep, Number(body, "repetition_penalty", 0, 2));
  if (rep) {
    if (*rep <= 0) return Invalid("repetition_penalty", "must be greater than 0");
    s.set_repetition_penalty(static_cast<float>(*rep));
  }
  const Json* bias = Field(body, "logit_bias");
  if (bias == nullptr) return absl::OkStatus();
  if (!bias->is_object()) return Invalid("logit_bias", "must be an object of token id -> bias");
  if (bias->size() > 1024) return Invalid("logit_bias", "may hold at most 1024 entries");
  for (const auto& [key, value] : bias->items()) {
    int64_t id = -1;
    if (!absl::SimpleAtoi(key, &id) || id < 0 || id > INT32_MAX) {
      return Invalid(absl::StrCat("logit_bias[", key, "]"), "keys must be token ids");
    }
    if (!value.is_number() || !(value.get<double>() >= -100 && value.get<double>() <= 100)) {
      return Invalid(absl::StrCat("logit_bias[", key, "]"), "must be a number in [-100, 100]");
    }
    (*s.mutable_logit_bias())[static_cast<int32_t>(id)] = static_cast<float>(value.get<double>());
  }
  return absl::OkStatus();
}

constexpr const char* kStreamOptionsFields[] = {"include_usage", "include_obfuscation"};

// The fields both endpoints share.
absl::Status CommonFields(const Json& body, PreparedRequest& out, FieldCheck& fields) {
  if (!body.is_object())
    return absl::InvalidArgumentError("the request body must be a JSON object");
  FLOTILLA_ASSIGN_OR_RETURN(bool ignore_eos, Bool(body, "ignore_eos"));
  out.sampling.set_ignore_eos(ignore_eos);
  FLOTILLA_ASSIGN_OR_RETURN(std::optional<int64_t> n, Integer(body, "n", 1, kMaxChoices));
  out.n = n ? static_cast<uint32_t>(*n) : 1;
  // We return every sequence we generate, so best_of can only be n.
  FLOTILLA_ASSIGN_OR_RETURN(std::optional<int64_t> best_of,
                            Integer(body, "best_of", 1, kMaxChoices));
  if (best_of && *best_of != out.n) {
    return Invalid("best_of", absl::StrCat("must equal n (", out.n,
                                           "): every generated sequence is returned"));
  }
  FLOTILLA_ASSIGN_OR_RETURN(out.stream, Bool(body, "stream"));
  if (const Json* so = Field(body, "stream_options")) {
    if (!so->is_object()) return Invalid("stream_options", "must be an object");
    if (!out.stream) return Invalid("stream_options", "is only allowed when stream is true");
    absl::StatusOr<bool> inc = Bool(*so, "include_usage");
    if (!inc.ok()) return Invalid("stream_options.include_usage", "must be true or false");
    out.include_usage = *inc;
    // include_obfuscation: a no-op (no padding is added to the chunks).
    FLOTILLA_RETURN_IF_ERROR(fields.Check(*so, kStreamOptionsFields, "stream_options."));
  }
  // vLLM's: cut the prompt (and max_tokens) to fit the context instead of a
  // context_length_exceeded error.
  FLOTILLA_ASSIGN_OR_RETURN(std::optional<int64_t> truncate,
                            Integer(body, "truncate_prompt_tokens", -1, INT32_MAX));
  if (truncate) {
    if (*truncate == 0) return Invalid("truncate_prompt_tokens", "must be -1 or a positive number");
    out.sampling.set_truncate_prompt_tokens(static_cast<int32_t>(*truncate));
  }
  FLOTILLA_RETURN_IF_ERROR(ReadSamplingFields(body, out));
  if (const Json* stop = Field(body, "stop")) {
    if (stop->is_string()) {
      out.stop.push_back(stop->get<std::string>());
    } else if (stop->is_array()) {
      if (stop->size() > 4) return Invalid("stop", "may hold at most 4 strings");
      for (size_t i = 0; i < stop->size(); ++i) {
        if (!(*stop)[i].is_string())
          return Invalid(absl::StrCat("stop[", i, "]"), "must be a string");
        out.stop.push_back((*stop)[i].get<std::string>());
      }
    } else {
      return Invalid("stop", "must be a string or an array of strings");
    }
    for (const std::string& st : out.stop) {
      if (st.empty()) return Invalid("stop", "stop strings must not be empty");
      FLOTILLA_RETURN_IF_ERROR(tokenizer::CheckUtf8(st, "stop"));
    }
  }
  return absl::OkStatus();
}

// What every endpoint reads first: its fields checked against those it
// knows (`known`), then the common ones.
absl::Status ReadCommon(const Json& body, Endpoint endpoint, absl::Span<const char* const> known,
                        FieldCheck& fields, PreparedRequest& out) {
  out.endpoint = endpoint;
  if (body.is_object()) FLOTILLA_RETURN_IF_ERROR(fields.Check(body, known));
  return CommonFields(body, out, fields);
}

// "Bad" token text: the token's bytes, which may be part of a character.
std::string TokenText(const tokenizer::Tokenizer& tok, int32_t id) {
  absl::StatusOr<std::string_view> b = tok.TokenBytes(static_cast<tokenizer::TokenId>(id));
  return b.ok() ? std::string(*b) : std::string();
}

Json BytesJson(const std::string& s) {
  Json a = Json::array();
  for (unsigned char c : s) a.push_back(static_cast<int>(c));
  return a;
}

// One prompt given as text: `field` names it in errors.
absl::StatusOr<std::vector<tokenizer::TokenId>> TextPrompt(const std::string& text,
                                                           const std::string& field,
                                                           const tokenizer::Tokenizer& tok,
                                                           size_t max_prompt_text_bytes) {
  if (text.empty()) return Invalid(field, "must not be empty");
  FLOTILLA_RETURN_IF_ERROR(CheckPromptTextBytes(text.size(), max_prompt_text_bytes, field));
  absl::StatusOr<std::vector<tokenizer::TokenId>> ids =
      tok.Encode(text, tokenizer::SpecialTokenPolicy::All());
  if (!ids.ok()) return Invalid(field, std::string(ids.status().message()));
  return *std::move(ids);
}

// One prompt given as token ids, each checked against the vocabulary.
absl::StatusOr<std::vector<tokenizer::TokenId>> IdPrompt(const Json& ids, const std::string& field,
                                                         const tokenizer::Tokenizer& tok) {
  if (ids.empty()) return Invalid(field, "must not be empty");
  std::vector<tokenizer::TokenId> out;
  out.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    const Json& id = ids[i];
    const std::string where = absl::StrCat(field, "[", i, "]");
    if (!id.is_number_integer()) return Invalid(where, "must be a token id (an integer)");
    const int64_t v = id.is_number_unsigned()
                          ? static_cast<int64_t>(std::min<uint64_t>(id.get<uint64_t>(), INT64_MAX))
                          : id.get<int64_t>();
    if (v < 0 || v >= tok.vocab_size() ||
        !tok.TokenBytes(static_cast<tokenizer::TokenId>(v)).ok()) {
      return Invalid(where, absl::StrCat(v, " is not a token id of this model's vocabulary (0 to ",
                                         tok.vocab_size() - 1, ")"));
    }
    out.push_back(static_cast<tokenizer::TokenId>(v));
  }
  return out;
}

// A completions `prompt`, as OpenAI takes it: a string, an array of strings,
// an array of token ids or an array of arrays of token ids.
absl::StatusOr<std::vector<std::vector<tokenizer::TokenId>>> CompletionPrompts(
    const Json& prompt, const tokenizer::Tokenizer& tok, size_t max_prompt_text_bytes) {
  std::vector<std::vector<tokenizer::TokenId>> out;
  if (prompt.is_string()) {
    FLOTILLA_ASSIGN_OR_RETURN(
        std::vector<tokenizer::TokenId> ids,
        TextPrompt(prompt.get<std::string>(), "prompt", tok, max_prompt_text_bytes));
    out.push_back(std::move(ids));
    return out;
  }
  const char* kShapes =
      "must be a string, an array of strings, an array of token ids or an array of arrays of "
      "token ids";
  if (!prompt.is_array() || prompt.empty()) return Invalid("prompt", kShapes);
  if (prompt[0].is_number()) {
    FLOTILLA_ASSIGN_OR_RETURN(std::vector<tokenizer::TokenId> ids, IdPrompt(prompt, "prompt", tok));
    out.push_back(std::move(ids));
    return out;
  }
  if (prompt.size() > kMaxBatchPrompts) {
    return Invalid("prompt", absl::StrCat("may hold at most ", kMaxBatchPrompts, " prompts, not ",
                                          prompt.size()));
  }
  for (size_t i = 0; i < prompt.size(); ++i) {
    const std::string field = absl::StrCat("prompt[", i, "]");
    const Json& p = prompt[i];
    if (p.is_string()) {
      FLOTILLA_ASSIGN_OR_RETURN(
          std::vector<tokenizer::TokenId> ids,
          TextPrompt(p.get<std::string>(), field, tok, max_prompt_text_bytes));
      out.push_back(std::move(ids));
    } else if (p.is_array()) {
      FLOTILLA_ASSIGN_OR_RETURN(std::vector<tokenizer::TokenId> ids, IdPrompt(p, field, tok));
      out.push_back(std::move(ids));
    } else {
      return Invalid(field, "must be a string or an array of token ids");
    }
  }
  return out;
}

// Chat's max_tokens (or max_completion_tokens), logprobs and end tokens:
// Harmony's <|return|> and <|call|>, then the request's stop_token_ids.
absl::Status ChatLimitsAndLogprobs(const Json& body, int vocab_size, PreparedRequest& out) {
  for (const char* key : {"max_completion_tokens", "max_tokens"}) {
    FLOTILLA_ASSIGN_OR_RETURN(bool given, ReadMaxTokens(body, key, out));
    if (given) break;
  }
  FLOTILLA_ASSIGN_OR_RETURN(out.logprobs, Bool(body, "logprobs"));
  FLOTILLA_ASSIGN_OR_RETURN(std::optional<int64_t> top, Integer(body, "top_logprobs", 0, 20));
  if (top && *top > 0 && !out.logprobs) return Invalid("top_logprobs", "needs logprobs: true");
  out.top_logprobs = top ? static_cast<int>(*top) : 0;
  out.sampling.set_return_logprobs(out.logprobs);
  out.sampling.set_logprobs(static_cast<uint32_t>(out.top_logprobs));
  return ReadChatEndTokens(body, vocab_size, out);
}

// How a status code answers over HTTP: its status, the OpenAI error type and
// code (null: none). Codes not listed: 500 server_error.
struct StatusMapping {
  absl::StatusCode code;
  int http_status;
  const char* type;
  const char* openai_code;
};
constexpr StatusMapping kStatusMappings[] = {
    {absl::StatusCode::kInvalidArgument, 400, "invalid_request_error", nullptr},
    {absl::StatusCode::kOutOfRange, 400, "invalid_request_error", nullptr},
    {absl::StatusCode::kFailedPrecondition, 400, "invalid_request_error", nullptr},
    {absl::StatusCode::kNotFound, 404, "invalid_request_error", "model_not_found"},
    {absl::StatusCode::kResourceExhausted, 429, "rate_limit_error", "rate_limit_exceeded"},
    {absl::StatusCode::kUnavailable, 503, "service_unavailable_error", nullptr},
    {absl::StatusCode::kDeadlineExceeded, 504, "timeout_error", nullptr},
};

}  // namespace

absl::Status ReadSamplingFields(const Json& body, PreparedRequest& out) {
  // vLLM's: the prefix-cache domain (requests share cached prompt blocks only
  // with requests of the same salt; without one, with those of the same key).
  if (const Json* salt = Field(body, "cache_salt")) {
    if (!salt->is_string() || salt->get_ref<const std::string&>().empty() ||
        salt->get_ref<const std::string&>().size() > kMaxCacheSaltBytes) {
      return Invalid("cache_salt", absl::StrCat("must be a non-empty string of at most ",
                                                kMaxCacheSaltBytes, " bytes"));
    }
    out.cache_salt = salt->get<std::string>();
  }
  // OpenAI's routing hint: requests with one key go to one instance while
  // that costs little (it never widens a prefix-cache domain: cache_salt's).
  if (const Json* key = Field(body, "prompt_cache_key")) {
    if (!key->is_string() || key->get_ref<const std::string&>().size() > kMaxCacheSaltBytes) {
      return Invalid("prompt_cache_key",
                     absl::StrCat("must be a string of at most ", kMaxCacheSaltBytes, " bytes"));
    }
    out.route_key = key->get<std::string>();
  }
  common::SamplingParams& s = out.sampling;
  FLOTILLA_ASSIGN_OR_RETURN(std::optional<double> t, Number(body, "temperature", 0, 2));
  if (t) s.set_temperature(static_cast<float>(*t));
  FLOTILLA_ASSIGN_OR_RETURN(std::optional<double> p, Number(body, "top_p", 0, 1));
  if (p) {
    if (*p <= 0) return Invalid("top_p", "must be greater than 0");
    s.set_top_p(static_cast<float>(*p));
  }
  FLOTILLA_ASSIGN_OR_RETURN(std::optional<double> fp, Number(body, "frequency_penalty", -2, 2));
  if (fp) s.set_frequency_penalty(static_cast<float>(*fp));
  FLOTILLA_ASSIGN_OR_RETURN(std::optional<double> pp, Number(body, "presence_penalty", -2, 2));
  if (pp) s.set_presence_penalty(static_cast<float>(*pp));
  FLOTILLA_RETURN_IF_ERROR(ExtraSamplingFields(body, s));
  FLOTILLA_ASSIGN_OR_RETURN(std::optional<int64_t> seed,
                            Integer(body, "seed", INT64_MIN, INT64_MAX));
  if (seed) s.set_seed(static_cast<uint64_t>(*seed));
  return absl::OkStatus();
}

absl::StatusOr<bool> ReadMaxTokens(const Json& body, const char* key, PreparedRequest& out) {
  FLOTILLA_ASSIGN_OR_RETURN(std::optional<int64_t> m, Integer(body, key, 1, UINT32_MAX));
  if (m) out.sampling.set_max_tokens(static_cast<uint32_t>(*m));
  return m.has_value();
}

absl::Status ReadChatEndTokens(const Json& body, int vocab_size, PreparedRequest& out) {
  out.sampling.add_stop_token_ids(tokenizer::kReturn);
  out.sampling.add_stop_token_ids(tokenizer::kCall);
  return ReadStopTokenFields(body, vocab_size, out.sampling);
}

ApiError ErrorFromStatus(const absl::Status& status) {
  ApiError e;
  e.message = std::string(status.message());
  e.http_status = 500;
  e.type = "server_error";
  for (const StatusMapping& m : kStatusMappings) {
    if (m.code != status.code()) continue;
    e.http_status = m.http_status;
    e.type = m.type;
    if (m.openai_code != nullptr) e.code = m.openai_code;
    break;
  }
  if (std::optional<std::string> code = OpenAiErrorCode(status)) {
    e.code = *code;
    // Named by the caller (messages or prompt); the message says the numbers.
    return e;
  }
  if (e.http_status == 400 || e.http_status == 404) {
    // "field.path: what" -> param = field.path
    const size_t colon = e.message.find(": ");
    if (colon != std::string::npos && colon > 0 && e.message.find(' ') > colon - 1 &&
        e.message.substr(0, colon).find(' ') == std::string::npos) {
      e.param = e.message.substr(0, colon);
      if (e.param == "request" || e.param == "request body") e.param.clear();
    }
  }
  return e;
}

Json ErrorJson(const ApiError& e) {
  Json err;
  err["message"] = e.message;
  err["type"] = e.type;
  err["param"] = e.param.empty() ? Json(nullptr) : Json(e.param);
  err["code"] = e.code.empty() ? Json(nullptr) : Json(e.code);
  return Json{{"error", err}};
}

std::string DumpJson(const Json& j) {
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

absl::StatusOr<Json> ParseBody(std::string_view body) {
  FLOTILLA_RETURN_IF_ERROR(tokenizer::CheckUtf8(body, "request body"));
  absl::StatusOr<Json> j = ParseJson<Json>(body, "the request body");
  if (!j.ok()) return j.status();
  if (!j->is_object()) return absl::InvalidArgumentError("the request body must be a JSON object");
  return j;
}

absl::StatusOr<PreparedRequest> PrepareChatRequest(const Json& body, std::string_view model_id,
                                                   const tokenizer::Tokenizer& tok,
                                                   const harmony::OpenAiRequestOptions& options,
                                                   size_t max_prompt_text_bytes,
                                                   UnknownFields unknown_fields) {
  PreparedRequest out;
  FieldCheck fields(unknown_fields);
  FLOTILLA_RETURN_IF_ERROR(ReadCommon(body, Endpoint::kChat, ChatFields(), fields, out));
  if (out.sampling.ignore_eos()) {
    return Invalid("ignore_eos",
                   "is not allowed for chat (the reply ends at Harmony's end tokens)");
  }
  FLOTILLA_RETURN_IF_ERROR(CheckModel(body, model_id));
  FLOTILLA_RETURN_IF_ERROR(ChatLimitsAndLogprobs(body, tok.vocab_size(), out));
  FLOTILLA_RETURN_IF_ERROR(CheckTextOnly(body));
  harmony::OpenAiRequestOptions harmony_options = options;
  FLOTILLA_RETURN_IF_ERROR(ReadChatTemplateKwargs(body, fields, harmony_options));
  FLOTILLA_ASSIGN_OR_RETURN(std::optional<Json> with_tools, MapLegacyFunctions(body));
  const Json& request = with_tools ? *with_tools : body;
  FLOTILLA_ASSIGN_OR_RETURN(harmony::ChatConversation conversation,
                            harmony::ParseChatConversation(request));
  FLOTILLA_RETURN_IF_ERROR(
      PrepareChatPrompt(conversation, harmony_options, tok, max_prompt_text_bytes, out));
  out.ignored_fields = fields.ignored();
  return out;
}

absl::StatusOr<PreparedRequest> PrepareCompletionRequest(const Json& body,
                                                         std::string_view model_id,
                                                         const tokenizer::Tokenizer& tok,
                                                         size_t max_prompt_text_bytes,
                                                         UnknownFields unknown_fields) {
  PreparedRequest out;
  FieldCheck fields(unknown_fields);
  FLOTILLA_RETURN_IF_ERROR(
      ReadCommon(body, Endpoint::kCompletions, CompletionFields(), fields, out));
  FLOTILLA_RETURN_IF_ERROR(CheckModel(body, model_id));
  FLOTILLA_ASSIGN_OR_RETURN(std::optional<int64_t> m, Integer(body, "max_tokens", 1, UINT32_MAX));
  out.sampling.set_max_tokens(m ? static_cast<uint32_t>(*m) : 16);  // OpenAI's default
  FLOTILLA_RETURN_IF_ERROR(ReadStopTokenFields(body, tok.vocab_size(), out.sampling));
  FLOTILLA_ASSIGN_OR_RETURN(std::optional<int64_t> lp, Integer(body, "logprobs", 0, 5));
  if (lp) {
    out.logprobs = true;
    out.top_logprobs = static_cast<int>(*lp);
    out.sampling.set_return_logprobs(true);
    out.sampling.set_logprobs(static_cast<uint32_t>(*lp));
  }
  if (const Json* suffix = Field(body, "suffix");
      suffix != nullptr &&
      !(suffix->is_string() && suffix->get_ref<const std::string&>().empty())) {
    return Invalid("suffix", "is not supported (gpt-oss does not fill in the middle)");
  }
  FLOTILLA_ASSIGN_OR_RETURN(out.echo, Bool(body, "echo"));
  if (out.echo && out.logprobs) {
    // The prompt's logprobs would have to come first; the workers return
    // prompt logits only over gRPC (Generate.return_prompt_logits).
    return Invalid("echo", "cannot be combined with logprobs");
  }
  const Json* prompt = Field(body, "prompt");
  if (prompt == nullptr) return Invalid("prompt", "is required");
  FLOTILLA_ASSIGN_OR_RETURN(std::vector<std::vector<tokenizer::TokenId>> prompts,
                            CompletionPrompts(*prompt, tok, max_prompt_text_bytes));
  out.prompt = prompts[0];
  if (prompts.size() > 1) out.batch = std::move(prompts);
  out.ignored_fields = fields.ignored();
  return out;
}

absl::StatusOr<ReasoningField> ParseReasoningField(std::string_view name) {
  if (name == "reasoning") return ReasoningField::kReasoning;
  if (name == "reasoning_content") return ReasoningField::kReasoningContent;
  if (name == "both") return ReasoningField::kBoth;
  return absl::InvalidArgumentError(
      absl::StrCat("--reasoning-field: '", std::string(name),
                   "' is not one of reasoning, reasoning_content, both"));
}

// ---- ResponseBuilder ----

ResponseBuilder::ResponseBuilder(const tokenizer::Tokenizer* tokenizer, Endpoint endpoint,
                                 std::string id, std::string model, int64_t created,
                                 std::vector<std::string> stop, bool logprobs, uint32_t choices)
    : tok_(tokenizer),
      endpoint_(endpoint),
      id_(std::move(id)),
      model_(std::move(model)),
      created_(created),
      logprobs_(logprobs),
      decoder_(tokenizer, endpoint == Endpoint::kChat ? Decoding::kHarmony : Decoding::kText, 0,
               id_, std::move(stop)),
      choices_(std::max<uint32_t>(choices, 1)) {}

void ResponseBuilder::PutReasoning(Json& message, const std::string& text) const {
  if (reasoning_field_ != ReasoningField::kReasoningContent) message["reasoning"] = text;
  if (reasoning_field_ != ReasoningField::kReasoning) message["reasoning_content"] = text;
}

Json ResponseBuilder::Chunk(uint32_t index, Json delta_or_text, const Json& logprobs,
                            const Json& finish_reason) const {
  Json choice;
  choice["index"] = index;
  if (endpoint_ == Endpoint::kChat) {
    choice["delta"] = std::move(delta_or_text);
  } else {
    choice["text"] = std::move(delta_or_text);
  }
  choice["logprobs"] = logprobs;
  choice["finish_reason"] = finish_reason;
  Json c;
  c["id"] = id_;
  c["object"] = endpoint_ == Endpoint::kChat ? "chat.completion.chunk" : "text_completion";
  c["created"] = created_;
  c["model"] = model_;
  c["choices"] = Json::array({std::move(choice)});
  return c;
}

std::vector<Json> ResponseBuilder::Begin() {
  std::vector<Json> out;
  if (endpoint_ != Endpoint::kChat) return out;
  for (uint32_t i = 0; i < choices_.size(); ++i) {
    out.push_back(Chunk(i, Json{{"role", "assistant"}, {"content", ""}}, nullptr, nullptr));
  }
  return out;
}

Json ResponseBuilder::LogprobsJson(const std::vector<common::TokenLogprob>& lps) const {
  if (endpoint_ == Endpoint::kChat) {
    Json content = Json::array();
    for (const common::TokenLogprob& lp : lps) {
      const std::string text = TokenText(*tok_, lp.token_id());
      Json item{{"token", text}, {"logprob", lp.logprob()}, {"bytes", BytesJson(text)}};
      Json top = Json::array();
      for (const common::TopLogprob& t : lp.top()) {
        const std::string tt = TokenText(*tok_, t.token_id());
        top.push_back(Json{{"token", tt}, {"logprob", t.logprob()}, {"bytes", BytesJson(tt)}});
      }
      item["top_logprobs"] = std::move(top);
      content.push_back(std::move(item));
    }
    return Json{{"content", std::move(content)}};
  }
  Json tokens = Json::array(), token_lps = Json::array(), tops = Json::array();
  for (const common::TokenLogprob& lp : lps) {
    tokens.push_back(TokenText(*tok_, lp.token_id()));
    token_lps.push_back(lp.logprob());
    Json top = Json::object();
    for (const common::TopLogprob& t : lp.top()) top[TokenText(*tok_, t.token_id())] = t.logprob();
    tops.push_back(std::move(top));
  }
  return Json{{"tokens", tokens}, {"token_logprobs", token_lps}, {"top_logprobs", tops}};
}

void ResponseBuilder::Emit(uint32_t choice, Json delta, std::vector<Json>& out) {
  Json lp = nullptr;
  Json& pending = choices_[choice].pending_logprobs;
  if (!pending.is_null()) lp = std::exchange(pending, Json());
  out.push_back(Chunk(choice, std::move(delta), lp, nullptr));
}

void ResponseBuilder::FlushLogprobs(uint32_t choice, std::vector<Json>& out) {
  // The tokens produced no text yet: send their logprobs with an empty delta.
  if (choices_[choice].pending_logprobs.is_null()) return;
  Emit(choice, endpoint_ == Endpoint::kChat ? Json::object() : Json(""), out);
}

void ResponseBuilder::AddLogprobs(uint32_t choice, const cluster::SequenceUpdate& u) {
  if (!logprobs_ || u.logprobs().empty()) return;
  Json lp =
      LogprobsJson(std::vector<common::TokenLogprob>(u.logprobs().begin(), u.logprobs().end()));
  Choice& c = choices_[choice];
  if (streaming_) {
    // Kept for Response() only, which a stream never asks for.
  } else if (endpoint_ == Endpoint::kChat) {
    if (c.logprob_items.is_null()) c.logprob_items = Json::array();
    for (Json& item : lp["content"]) c.logprob_items.push_back(item);
  } else {
    if (c.logprob_items.is_null()) {
      c.logprob_items = Json{{"tokens", Json::array()},
                             {"token_logprobs", Json::array()},
                             {"top_logprobs", Json::array()}};
    }
    for (const char* k : {"tokens", "token_logprobs", "top_logprobs"}) {
      for (Json& v : lp[k]) c.logprob_items[k].push_back(v);
    }
  }
  if (c.pending_logprobs.is_null()) {
    c.pending_logprobs = std::move(lp);
    return;
  }
  // Earlier tokens made no text yet: these wait with theirs (every field is
  // an array), so a stream carries every token's logprobs, as the whole
  // answer does.
  for (auto& [key, values] : lp.items()) {
    for (Json& v : values) c.pending_logprobs[key].push_back(std::move(v));
  }
}

void ResponseBuilder::AddToolCall(const RequestEvent& e, std::vector<Json>& out) {
  Json& calls = choices_[e.choice].tool_calls;
  const ToolCallPiece& piece = e.tool_call;
  Json call;
  call["index"] = piece.index;
  if (piece.index >= calls.size()) {
    calls.push_back(Json{{"id", piece.id},
                         {"type", "function"},
                         {"function", {{"name", piece.name}, {"arguments", ""}}}});
  }
  Json& whole = calls[piece.index]["function"]["arguments"];
  whole = whole.get<std::string>() + piece.arguments;
  if (!piece.id.empty()) {
    call["id"] = piece.id;
    call["type"] = "function";
    call["function"] = {{"name", piece.name}, {"arguments", piece.arguments}};
  } else {
    call["function"] = {{"arguments", piece.arguments}};
  }
  Emit(e.choice, Json{{"tool_calls", Json::array({std::move(call)})}}, out);
}

std::vector<Json> ResponseBuilder::Consume(const std::vector<RequestEvent>& events) {
  std::vector<Json> out;
  for (const RequestEvent& e : events) {
    if (e.kind != RequestEvent::Kind::kUsage && e.kind != RequestEvent::Kind::kError &&
        e.choice >= choices_.size()) {
      continue;  // not one of ours
    }
    Choice& c = choices_[std::min<size_t>(e.choice, choices_.size() - 1)];
    switch (e.kind) {
      case RequestEvent::Kind::kTokens:
        if (e.update != nullptr) AddLogprobs(e.choice, *e.update);
        break;
      case RequestEvent::Kind::kReasoning: {
        c.reasoning += e.text;
        Json delta = Json::object();
        PutReasoning(delta, e.text);
        Emit(e.choice, std::move(delta), out);
        break;
      }
      case RequestEvent::Kind::kContent:
        c.content += e.text;
        Emit(e.choice, endpoint_ == Endpoint::kChat ? Json{{"content", e.text}} : Json(e.text),
             out);
        break;
      case RequestEvent::Kind::kToolCall:
        AddToolCall(e, out);
        break;
      case RequestEvent::Kind::kMessageStart:
      case RequestEvent::Kind::kMessageEnd:
        break;  // chat merges a choice's messages per channel
      case RequestEvent::Kind::kFinish:
        FlushLogprobs(e.choice, out);
        c.finish_reason = e.finish_reason;
        out.push_back(Chunk(e.choice, endpoint_ == Endpoint::kChat ? Json::object() : Json(""),
                            nullptr, e.finish_reason));
        break;
      case RequestEvent::Kind::kUsage:
      case RequestEvent::Kind::kError:
        usage_ = e.usage;
        break;
    }
  }
  for (uint32_t i = 0; i < choices_.size(); ++i) FlushLogprobs(i, out);
  return out;
}

std::vector<Json> ResponseBuilder::Feed(const std::vector<tokenizer::TokenId>& tokens,
                                        const std::vector<common::TokenLogprob>& logprobs) {
  cluster::SequenceUpdate u;
  for (tokenizer::TokenId t : tokens) u.add_token_ids(static_cast<int32_t>(t));
  for (const common::TokenLogprob& lp : logprobs) *u.add_logprobs() = lp;
  return FeedUpdate(u);
}

std::vector<Json> ResponseBuilder::FeedUpdate(const cluster::SequenceUpdate& u) {
  if (decoder_.finished() || decoder_.stopped_by_string()) return {};
  std::vector<RequestEvent> events(1);
  events[0].kind = RequestEvent::Kind::kTokens;
  events[0].update = &u;
  std::vector<tokenizer::TokenId> ids(u.token_ids().begin(), u.token_ids().end());
  decoder_.Feed(ids, events);
  return Consume(events);
}

std::vector<Json> ResponseBuilder::Finish(common::FinishReason reason,
                                          std::optional<tokenizer::TokenId> stop_token,
                                          uint32_t prompt_tokens, uint32_t completion_tokens) {
  if (decoder_.finished()) return {};
  std::vector<RequestEvent> events;
  const TokenUsage usage{prompt_tokens, completion_tokens};
  decoder_.Finish(reason, stop_token, usage, events);
  usage_ = usage;
  // Logprobs not yet sent stay in the whole response only.
  choices_[0].pending_logprobs = Json();
  return Consume(events);
}

Json ResponseBuilder::Usage() const {
  return Json{{"prompt_tokens", usage_.prompt_tokens},
              {"completion_tokens", usage_.completion_tokens},
              {"total_tokens", usage_.prompt_tokens + usage_.completion_tokens}};
}

Json ResponseBuilder::UsageChunk() const {
  Json c;
  c["id"] = id_;
  c["object"] = endpoint_ == Endpoint::kChat ? "chat.completion.chunk" : "text_completion";
  c["created"] = created_;
  c["model"] = model_;
  c["choices"] = Json::array();
  c["usage"] = Usage();
  return c;
}

Json ResponseBuilder::ChoiceJson(uint32_t index) const {
  const Choice& c = choices_[index];
  Json choice;
  choice["index"] = index;
  if (endpoint_ == Endpoint::kChat) {
    Json message;
    message["role"] = "assistant";
    // A call the length limit cut (a finished call ends the turn, so a
    // "length" choice's call is cut) is no call: its arguments are not JSON.
    // The stream has sent its pieces; the whole message leaves it out.
    const bool calls = !c.tool_calls.empty() && c.finish_reason != "length";
    message["content"] = c.content.empty() && calls ? Json(nullptr) : Json(c.content);
    if (!c.reasoning.empty()) PutReasoning(message, c.reasoning);
    if (calls) message["tool_calls"] = c.tool_calls;
    choice["message"] = std::move(message);
  } else {
    choice["text"] = c.content;
  }
  if (!logprobs_) {
    choice["logprobs"] = nullptr;
  } else if (endpoint_ == Endpoint::kChat) {
    choice["logprobs"] =
        Json{{"content", c.logprob_items.is_null() ? Json::array() : c.logprob_items}};
  } else {
    choice["logprobs"] = c.logprob_items.is_null() ? Json::array() : c.logprob_items;
  }
  choice["finish_reason"] = c.finish_reason;
  return choice;
}

Json ResponseBuilder::Response() const {
  Json choices = Json::array();
  for (uint32_t i = 0; i < choices_.size(); ++i) choices.push_back(ChoiceJson(i));
  Json r;
  r["id"] = id_;
  r["object"] = endpoint_ == Endpoint::kChat ? "chat.completion" : "text_completion";
  r["created"] = created_;
  r["model"] = model_;
  r["choices"] = std::move(choices);
  r["usage"] = Usage();
  return r;
}

}  // namespace flotilla::coordinator
