#include "coordinator/http/request_fields.h"

#include <algorithm>
#include <cctype>

#include "absl/strings/str_cat.h"
#include "coordinator/json_fields.h"

namespace flotilla::coordinator {
namespace {

// OpenAI's ChatCompletionCreateParams (the `openai` npm package's types),
// then vLLM's extras this server acts on. What each does: coordinator/README.md.
constexpr const char* kChat[] = {
    // OpenAI
    "messages", "model", "audio", "frequency_penalty", "function_call", "functions", "logit_bias",
    "logprobs", "max_completion_tokens", "max_tokens", "metadata", "modalities", "moderation", "n",
    "parallel_tool_calls", "prediction", "presence_penalty", "prompt_cache_key",
    "prompt_cache_options", "prompt_cache_retention", "reasoning_effort", "response_format",
    "safety_identifier", "seed", "service_tier", "stop", "store", "stream", "stream_options",
    "temperature", "tool_choice", "tools", "top_logprobs", "top_p", "user", "verbosity",
    "web_search_options",
    // vLLM
    "top_k", "min_p", "repetition_penalty", "truncate_prompt_tokens", "ignore_eos", "cache_salt",
    "best_of", "stop_token_ids", "min_tokens", "chat_template_kwargs"};

// OpenAI's CompletionCreateParams, then vLLM's extras.
constexpr const char* kCompletion[] = {
    // OpenAI
    "model", "prompt", "best_of", "echo", "frequency_penalty", "logit_bias", "logprobs",
    "max_tokens", "n", "presence_penalty", "seed", "stop", "stream", "stream_options", "suffix",
    "temperature", "top_p", "user",
    // vLLM
    "top_k", "min_p", "repetition_penalty", "truncate_prompt_tokens", "ignore_eos", "cache_salt",
    "stop_token_ids", "min_tokens"};

// OpenAI's ResponseCreateParams, then the sampling extras the chat pipeline
// reads under the same names.
constexpr const char* kResponses[] = {
    // OpenAI
    "access_programs", "background", "background_options", "context_management", "conversation",
    "image", "include", "input", "instructions", "max_output_tokens", "max_tool_calls", "metadata",
    "model", "moderation", "parallel_tool_calls", "previous_response_id", "prompt",
    "prompt_cache_key", "prompt_cache_options", "prompt_cache_retention", "reasoning",
    "safety_identifier", "service_tier", "store", "stream", "stream_options", "temperature", "text",
    "tool_choice", "tools", "top_logprobs", "top_p", "truncation", "user",
    // vLLM
    "top_k", "min_p", "repetition_penalty", "logit_bias", "frequency_penalty", "presence_penalty",
    "seed", "cache_salt", "stop_token_ids", "min_tokens", "chat_template_kwargs"};

constexpr size_t kMaxHeaderNames = 16;
constexpr size_t kMaxHeaderNameBytes = 64;

bool HeaderSafe(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-' ||
         c == '[' || c == ']';
}

}  // namespace

absl::Span<const char* const> ChatFields() { return kChat; }
absl::Span<const char* const> CompletionFields() { return kCompletion; }
absl::Span<const char* const> ResponsesFields() { return kResponses; }

absl::Status FieldCheck::Check(const nlohmann::ordered_json& object,
                               absl::Span<const char* const> known, const std::string& prefix) {
  for (const auto& item : object.items()) {
    const std::string& key = item.key();
    const bool found =
        std::any_of(known.begin(), known.end(), [&key](const char* k) { return key == k; });
    if (!found) {
      absl::Status st = Unknown(prefix + key);
      if (!st.ok()) return st;
    }
  }
  return absl::OkStatus();
}

absl::Status FieldCheck::Unknown(const std::string& field) {
  if (policy_ == UnknownFields::kRefuse) {
    return json_fields::Invalid(field,
                                "is not a field this endpoint takes (--strict-request-fields)");
  }
  ignored_.push_back(field);
  return absl::OkStatus();
}

std::string IgnoredFieldsHeaderValue(const std::vector<std::string>& ignored) {
  std::string out;
  const size_t shown = std::min(ignored.size(), kMaxHeaderNames);
  for (size_t i = 0; i < shown; ++i) {
    if (i > 0) out += ',';
    std::string name = ignored[i].substr(0, kMaxHeaderNameBytes);
    for (char& c : name) {
      if (!HeaderSafe(c)) c = '?';
    }
    out += name;
  }
  if (ignored.size() > shown) absl::StrAppend(&out, ",...(", ignored.size() - shown, " more)");
  return out;
}

}  // namespace flotilla::coordinator
