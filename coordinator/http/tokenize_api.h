// vLLM's /tokenize and /detokenize bodies: prompts or chat conversations to
// the token ids the completions and chat endpoints would feed the model, and
// token ids back to text. JSON in, JSON out; no server code.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/harmony/openai.h"
#include "common/tokenizer/tokenizer.h"

namespace flotilla::coordinator {

struct TokenizeContext {
  const tokenizer::Tokenizer* tok = nullptr;
  harmony::OpenAiRequestOptions harmony;  // the chat endpoint's system defaults
  std::string model_id;                   // what a missing `model` means
  uint64_t max_model_len = 0;             // reported as max_model_len
  size_t max_prompt_text_bytes = 0;       // 0 = no limit
};

// POST /tokenize. Either {"prompt": TEXT} (tokenized as /v1/completions
// does, special tokens allowed) or {"messages": [...], "tools"?,
// "tool_choice"?, "reasoning_effort"?} (rendered with Harmony as
// /v1/chat/completions does); optional "model", "add_special_tokens" (no
// effect: o200k adds none), "add_generation_prompt" (default true: the
// trailing <|start|>assistant), "continue_final_message" (false only),
// "return_token_strs". Answers {"count", "max_model_len", "tokens",
// "token_strs"} (token_strs: each token's text, bytes that are not UTF-8
// replaced; null unless asked). Errors name the field.
absl::StatusOr<nlohmann::ordered_json> Tokenize(const nlohmann::ordered_json& body, const TokenizeContext& context);

// POST /detokenize: {"tokens": [ids], "model"?} -> {"prompt": TEXT}
// (special tokens spelled out, bytes that are not UTF-8 replaced).
absl::StatusOr<nlohmann::ordered_json> Detokenize(const nlohmann::ordered_json& body, const TokenizeContext& context);

}  // namespace flotilla::coordinator
