#include "worker/engine/engine.h"

#include "absl/strings/str_cat.h"

namespace flotilla {

absl::Status CheckStepItem(const StepItem& item, bool known, int vocab_size,
                           std::unordered_set<int64_t>* seen, bool verifies_drafts) {
  if (!known) {
    return absl::InvalidArgumentError(absl::StrCat("step: unknown sequence ", item.sequence));
  }
  if (!seen->insert(item.sequence).second) {
    return absl::InvalidArgumentError(
        absl::StrCat("step: sequence ", item.sequence, " appears twice in one step"));
  }
  if (item.tokens.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("step: sequence ", item.sequence, " brings no tokens"));
  }
  for (size_t i = 0; i < item.tokens.size(); ++i) {
    if (item.tokens[i] < 0 || item.tokens[i] >= vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "token id ", item.tokens[i], " at index ", i, " of sequence ", item.sequence,
          " is out of range [0, ", vocab_size, ")"));
    }
  }
  if ((item.draft_tokens != 0 || !item.accepted_draft.empty()) && !verifies_drafts) {
    return absl::InvalidArgumentError(absl::StrCat(
        "step: sequence ", item.sequence,
        " brings drafted tokens, but this engine does not verify drafts (speculative decoding)"));
  }
  if (item.draft_tokens < 0 || item.draft_tokens >= static_cast<int64_t>(item.tokens.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("step: sequence ", item.sequence, " marks ", item.draft_tokens, " of its ",
                     item.tokens.size(), " tokens as drafted; at least one must not be"));
  }
  for (int32_t t : item.accepted_draft) {
    if (t < 0 || t >= vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("accepted drafted token id ", t,
                                                     " of sequence ", item.sequence,
                                                     " is out of range [0, ", vocab_size, ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace flotilla
