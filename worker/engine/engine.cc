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

absl::Status CheckGroupLogits(const std::vector<StepItem>& items, bool splits) {
  size_t marked = 0;
  for (const StepItem& it : items) marked += it.group_logits ? 1 : 0;
  if (marked == 0) return absl::OkStatus();
  if (!splits) {
    return absl::InvalidArgumentError(
        "step: items ask for group logits, but this engine is not a rank of a tensor-parallel "
        "group of two or more on a device");
  }
  if (marked != items.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("step: ", marked, " of ", items.size(),
                     " items ask for group logits; a step with group logits must mark every item"));
  }
  if (items.size() > static_cast<size_t>(kMaxGroupLogitRows)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "step: ", items.size(), " items ask for group logits, more than ", kMaxGroupLogitRows));
  }
  for (const StepItem& it : items) {
    if (it.logits == LogitsMode::kAll || it.draft_tokens != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("step: sequence ", it.sequence,
                       " asks for group logits with all its logit rows or drafted tokens; "
                       "group logits are the last position's alone"));
    }
  }
  return absl::OkStatus();
}

}  // namespace flotilla
