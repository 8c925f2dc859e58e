#include "coordinator/http/tokenize_api.h"

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "coordinator/http/openai_pipeline.h"
#include "coordinator/json_fields.h"

namespace flotilla::coordinator {
namespace {

namespace tk = tokenizer;

using json_fields::CheckModel;
using json_fields::Invalid;

absl::StatusOr<bool> OptionalBool(const Json& body, const char* key, bool fallback) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) return Invalid(key, "must be true or false");
  return it->get<bool>();
}

// `bytes` with every byte that does not start valid UTF-8 replaced by U+FFFD.
std::string LossyUtf8(std::string_view bytes) {
  std::string out;
  while (!bytes.empty()) {
    const size_t valid = tk::ValidUtf8Prefix(bytes);
    out.append(bytes.substr(0, valid));
    bytes.remove_prefix(valid);
    if (!bytes.empty()) {
      out += "\xEF\xBF\xBD";
      bytes.remove_prefix(1);
    }
  }
  return out;
}

// The fields of `body` that the chat or completions request builder reads,
// `model` filled in: tokenize-only fields stay out of their checks.
Json RequestFor(const Json& body, const TokenizeContext& context, std::initializer_list<const char*> keys) {
  Json request = Json::object();
  auto model = body.find("model");
  request["model"] = model != body.end() && !model->is_null() ? *model : Json(context.model_id);
  for (const char* key : keys) {
    if (auto it = body.find(key); it != body.end()) request[key] = *it;
  }
  return request;
}

absl::StatusOr<std::vector<tk::TokenId>> ChatTokens(const Json& body, const TokenizeContext& context) {
  FLOTILLA_ASSIGN_OR_RETURN(bool continue_final, OptionalBool(body, "continue_final_message", false));
  if (continue_final) return Invalid("continue_final_message", "only false is supported");
  FLOTILLA_ASSIGN_OR_RETURN(bool generation_prompt, OptionalBool(body, "add_generation_prompt", true));
  const Json request = RequestFor(body, context, {"messages", "tools", "tool_choice", "reasoning_effort"});
  FLOTILLA_ASSIGN_OR_RETURN(PreparedRequest prepared,
                            PrepareChatRequest(request, context.model_id, *context.tok,
                                               context.harmony, context.max_prompt_text_bytes));
  if (!generation_prompt) {
    // The rendered prompt ends with the assistant's header, `<|start|>assistant`.
    FLOTILLA_ASSIGN_OR_RETURN(std::vector<tk::TokenId> header,
                              context.tok->Encode("<|start|>assistant", tk::SpecialTokenPolicy::All()));
    if (prepared.prompt.size() >= header.size()) prepared.prompt.resize(prepared.prompt.size() - header.size());
  }
  return prepared.prompt;
}

absl::StatusOr<std::vector<tk::TokenId>> PromptTokens(const Json& body, const TokenizeContext& context) {
  const Json request = RequestFor(body, context, {"prompt"});
  FLOTILLA_ASSIGN_OR_RETURN(PreparedRequest prepared,
                            PrepareCompletionRequest(request, context.model_id, *context.tok,
                                                     context.max_prompt_text_bytes));
  return prepared.prompt;
}

}  // namespace

absl::StatusOr<Json> Tokenize(const Json& body, const TokenizeContext& context) {
  if (!body.is_object()) return absl::InvalidArgumentError("the request body must be a JSON object");
  const bool chat = body.contains("messages");
  if (chat == body.contains("prompt")) return Invalid("prompt", "give exactly one of prompt and messages");
  FLOTILLA_RETURN_IF_ERROR(OptionalBool(body, "add_special_tokens", true).status());
  FLOTILLA_ASSIGN_OR_RETURN(bool token_strs, OptionalBool(body, "return_token_strs", false));
  FLOTILLA_ASSIGN_OR_RETURN(std::vector<tk::TokenId> tokens,
                            chat ? ChatTokens(body, context) : PromptTokens(body, context));
  Json out = {{"count", tokens.size()}, {"max_model_len", context.max_model_len}, {"tokens", tokens},
              {"token_strs", nullptr}};
  if (token_strs) {
    Json strs = Json::array();
    for (tk::TokenId id : tokens) {
      FLOTILLA_ASSIGN_OR_RETURN(std::string_view bytes, context.tok->TokenBytes(id));
      strs.push_back(LossyUtf8(bytes));
    }
    out["token_strs"] = std::move(strs);
  }
  return out;
}

absl::StatusOr<Json> Detokenize(const Json& body, const TokenizeContext& context) {
  if (!body.is_object()) return absl::InvalidArgumentError("the request body must be a JSON object");
  // A `model`, when given, must be the served one (as the other endpoints say).
  FLOTILLA_RETURN_IF_ERROR(CheckModel(body, context.model_id, /*required=*/false));
  auto tokens = body.find("tokens");
  if (tokens == body.end()) return Invalid("tokens", "is required");
  if (!tokens->is_array()) return Invalid("tokens", "must be an array of token ids");
  std::vector<tk::TokenId> ids;
  for (size_t i = 0; i < tokens->size(); ++i) {
    const Json& t = (*tokens)[i];
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= context.tok->vocab_size()) {
      return Invalid(absl::StrCat("tokens[", i, "]"),
                     absl::StrCat("must be a token id in [0, ", context.tok->vocab_size(), "), not ", t.dump()));
    }
    ids.push_back(static_cast<tk::TokenId>(t.get<int64_t>()));
  }
  FLOTILLA_ASSIGN_OR_RETURN(std::string bytes, context.tok->DecodeBytes(ids));
  return Json{{"prompt", LossyUtf8(bytes)}};
}

}  // namespace flotilla::coordinator
