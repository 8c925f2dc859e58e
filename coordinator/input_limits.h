// Bounds on client input, checked before any expensive work: a request's size
// before it is parsed, and a prompt's bytes before they are tokenised (the
// tokenizer costs seconds and gigabytes on a 100 MiB text; these checks cost
// microseconds).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/tokenizer/tokenizer.h"
#include "proto/cluster.pb.h"

namespace flotilla::coordinator {

// Default of --max-request-bytes: the largest HTTP body and the largest gRPC
// client message (Generate, Chat, ...).
inline constexpr size_t kDefaultMaxRequestBytes = size_t{16} << 20;
// The gRPC server's transport receive limit is the larger of this and
// --max-request-bytes: workers split their session messages at 16 MiB
// (worker/worker_messages.h), and this leaves room for the framing. Client
// calls are held to --max-request-bytes by the services themselves.
inline constexpr size_t kWorkerSessionMessageBytes = size_t{32} << 20;

// The most bytes any one token of `tok` stands for (ordinary tokens; special
// tokens by the length of their names).
size_t LongestTokenBytes(const tokenizer::Tokenizer& tok);

// The longest prompt text (in bytes) that can fit `context_tokens`: every token
// stands for at most LongestTokenBytes bytes, so a longer text needs more
// tokens than the context holds and is refused untokenised.
size_t PromptTextByteLimit(int64_t context_tokens, const tokenizer::Tokenizer& tok);

// The limits one server applies to its clients' requests.
struct InputLimits {
  size_t max_request_bytes = kDefaultMaxRequestBytes;  // 0 = no limit
  size_t max_prompt_text_bytes = 0;                    // 0 = no limit; see PromptTextByteLimit
};

// INVALID_ARGUMENT naming `what`, the size and the limit when `bytes` is over
// `limit` (0 = no limit).
absl::Status CheckPromptTextBytes(size_t bytes, size_t limit, absl::string_view what);

// RESOURCE_EXHAUSTED naming the size and the limit (--max-request-bytes) when
// a request of `bytes` is over `limit` (0 = no limit).
absl::Status CheckRequestBytes(size_t bytes, size_t limit);

// The OpenAI error code of a request that does not fit the context.
inline constexpr char kContextLengthExceeded[] = "context_length_exceeded";

// Fits `request` to a context of `context` tokens (prompt + max_tokens, where
// max_tokens 0 means "up to the context"). When the request asked to be
// truncated (sampling.truncate_prompt_tokens), the prompt keeps its last N
// tokens (-1: context - 1) and max_tokens shrinks to the room left. Otherwise
// a request that does not fit is INVALID_ARGUMENT with vLLM's message ("This
// model's maximum context length is C tokens. However, you requested T tokens
// (P in the messages, M in the completion). ...") and the OpenAI code
// context_length_exceeded as a payload (OpenAiErrorCode).
absl::Status FitToContext(cluster::SubmitSequence& request, int64_t context);

// The OpenAI error `code` a status carries (set by FitToContext), if any.
std::optional<std::string> OpenAiErrorCode(const absl::Status& status);

}  // namespace flotilla::coordinator
