// The typed request every front end parses into: OpenAI chat and completions
// JSON (http/openai_pipeline.h), Responses JSON (http/responses_request.h),
// and the flotilla.v1 Chat and Generate messages (grpc/chat_pipeline.h,
// grpc/generate_request.h). Validated, its prompt rendered and tokenised;
// session_request.h turns it into what RequestSession runs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/grammar/output_constraint.h"
#include "common/tokenizer/tokenizer.h"
#include "proto/common.pb.h"

namespace flotilla::coordinator {

// How the generated tokens are read: chat (Harmony: reasoning, answer text,
// tool calls) or completions (plain text).
enum class Endpoint { kChat, kCompletions };

// A validated request, ready for RequestSession.
struct PreparedRequest {
  Endpoint endpoint = Endpoint::kChat;
  std::vector<tokenizer::TokenId> prompt;  // the prompt (a batch's first)
  // Completions with a batched prompt (an array of strings or of token id
  // arrays): every prompt in order, `prompt` being the first; empty otherwise.
  std::vector<std::vector<tokenizer::TokenId>> batch;
  uint32_t n = 1;     // choices per prompt
  bool echo = false;  // completions: the prompt text precedes each choice's text
  common::SamplingParams sampling;
  std::vector<std::string> stop;  // stop strings
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool logprobs = false;
  int top_logprobs = 0;
  // Generate: the prompt's logits are streamed before the first token.
  bool return_prompt_logits = false;
  // Structured outputs (chat only): the constraint the worker decodes under.
  std::optional<grammar::ConstraintSpec> constraint;
  // The request's `cache_salt` (empty: none): see coordinator/cache_domain.h.
  std::string cache_salt;
  // Which requests belong together for the router (OpenAI's
  // `prompt_cache_key`, or the `x-session-id` header): they stay on one
  // instance while that costs little. Empty: the prompt's opening decides.
  std::string route_key;
  // The fields the request carried that this server does not know, ignored
  // (request_fields.h: the response names them in a header).
  std::vector<std::string> ignored_fields;
};

// The longest `cache_salt` a request may carry.
inline constexpr size_t kMaxCacheSaltBytes = 1024;
// The most prompts of one batched completions request, and the most choices
// per prompt (`n`).
inline constexpr size_t kMaxBatchPrompts = 64;
inline constexpr int64_t kMaxChoices = 16;

// Every prompt of `request`: its batch, else its one prompt.
std::vector<std::vector<tokenizer::TokenId>> Prompts(const PreparedRequest& request);

}  // namespace flotilla::coordinator
