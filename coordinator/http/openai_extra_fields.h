// The request fields beyond OpenAI's core sampling set that change how a chat
// or completions request is prepared: vLLM's `stop_token_ids`, `min_tokens`
// and `chat_template_kwargs`, OpenAI's deprecated `functions` /
// `function_call` (mapped onto `tools` / `tool_choice`) and the output
// modalities (`modalities`, `audio`: text only). PrepareChatRequest and
// PrepareCompletionRequest call them; errors name the field.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/harmony/openai.h"
#include "coordinator/http/request_fields.h"
#include "proto/common.pb.h"

namespace flotilla::coordinator {

// The most `stop_token_ids` a request may give.
inline constexpr size_t kMaxStopTokenIds = 64;

// `stop_token_ids` (token ids of the vocabulary of `vocab_size` tokens, added
// to the sequence's end tokens) and `min_tokens` (the end tokens, those ids
// included, are suppressed until that many tokens were generated; at most
// max_tokens when that is set) into `sampling`.
absl::Status ReadStopTokenFields(const nlohmann::ordered_json& body, int vocab_size,
                                 common::SamplingParams& sampling);

// `chat_template_kwargs`: what Harmony's system message has a place for
// (`reasoning_effort`, `model_identity`, `knowledge_cutoff`,
// `conversation_start_date`) goes into `options`; any other key is an
// unknown field "chat_template_kwargs.KEY" for `fields`.
absl::Status ReadChatTemplateKwargs(const nlohmann::ordered_json& body, FieldCheck& fields,
                                    harmony::OpenAiRequestOptions& options);

// `modalities` (only "text") and `audio` (not given): a request for audio
// output is refused naming the field.
absl::Status CheckTextOnly(const nlohmann::ordered_json& body);

// A body with `functions` / `function_call` as `tools` / `tool_choice`
// (nullopt: the body has neither). Giving both forms is refused.
absl::StatusOr<std::optional<nlohmann::ordered_json>> MapLegacyFunctions(
    const nlohmann::ordered_json& body);

}  // namespace flotilla::coordinator
