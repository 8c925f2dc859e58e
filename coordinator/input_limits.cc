#include "coordinator/input_limits.h"

#include <algorithm>
#include <string_view>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"

namespace flotilla::coordinator {

size_t LongestTokenBytes(const tokenizer::Tokenizer& tok) {
  size_t longest = 1;
  for (tokenizer::TokenId id = 0; id < tok.vocab_size(); ++id) {
    absl::StatusOr<std::string_view> bytes = tok.TokenBytes(id);
    if (bytes.ok()) longest = std::max(longest, bytes->size());
  }
  return longest;
}

size_t PromptTextByteLimit(int64_t context_tokens, const tokenizer::Tokenizer& tok) {
  if (context_tokens <= 0) return 0;
  return static_cast<size_t>(context_tokens) * LongestTokenBytes(tok);
}

absl::Status CheckPromptTextBytes(size_t bytes, size_t limit, absl::string_view what) {
  if (limit == 0 || bytes <= limit) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      what, ": ", bytes, " bytes of text cannot fit the model's context (at most ", limit,
      " bytes: context tokens x the longest token's bytes); shorten the prompt"));
}

absl::Status CheckRequestBytes(size_t bytes, size_t limit) {
  if (limit == 0 || bytes <= limit) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat("the request is ", bytes,
                                                   " bytes, over this server's limit of ", limit,
                                                   " bytes (--max-request-bytes)"));
}

namespace {
constexpr char kOpenAiCodeUrl[] = "type.flotilla.dev/openai-error-code";
}  // namespace

absl::Status FitToContext(cluster::SubmitSequence& request, int64_t context) {
  common::SamplingParams& sampling = *request.mutable_sampling();
  const int64_t prompt = request.prompt_ids_size();
  if (context <= 0) return absl::OkStatus();
  if (sampling.has_truncate_prompt_tokens()) {
    const int64_t asked = sampling.truncate_prompt_tokens();
    if (asked == 0 || asked < -1) {
      return absl::InvalidArgumentError(
          "truncate_prompt_tokens: must be -1 (as much as fits) or a positive number of tokens");
    }
    const int64_t keep = std::min<int64_t>(asked == -1 ? context - 1 : asked, context - 1);
    if (prompt > keep) {
      request.mutable_prompt_ids()->erase(request.mutable_prompt_ids()->begin(),
                                          request.mutable_prompt_ids()->begin() + (prompt - keep));
    }
    const int64_t room = context - request.prompt_ids_size();
    if (sampling.max_tokens() > room) sampling.set_max_tokens(static_cast<uint32_t>(room));
    return absl::OkStatus();
  }
  const int64_t max_tokens = sampling.max_tokens();
  absl::Status st;
  if (max_tokens == 0 && prompt >= context) {
    st = absl::InvalidArgumentError(absl::StrCat(
        "This model's maximum context length is ", context, " tokens. However, you requested ",
        prompt, " tokens in the messages, which leaves no room for the completion. Please reduce "
        "the length of the messages (or set truncate_prompt_tokens)."));
  } else if (max_tokens > 0 && prompt + max_tokens > context) {
    st = absl::InvalidArgumentError(absl::StrCat(
        "This model's maximum context length is ", context, " tokens. However, you requested ",
        prompt + max_tokens, " tokens (", prompt, " in the messages, ", max_tokens,
        " in the completion). Please reduce the length of the messages or completion (or set "
        "truncate_prompt_tokens)."));
  } else {
    return absl::OkStatus();
  }
  st.SetPayload(kOpenAiCodeUrl, absl::Cord(kContextLengthExceeded));
  return st;
}

std::optional<std::string> OpenAiErrorCode(const absl::Status& status) {
  absl::optional<absl::Cord> code = status.GetPayload(kOpenAiCodeUrl);
  if (!code) return std::nullopt;
  return std::string(*code);
}

}  // namespace flotilla::coordinator
