#include "coordinator/input_limits.h"

#include <algorithm>
#include <string_view>

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

}  // namespace flotilla::coordinator
