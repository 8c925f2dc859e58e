#include "worker/engine/draft_verify.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace flotilla {

VerifiedDraft VerifyDraft(Sampler& sampler, const float* rows, int64_t vocab_size,
                          absl::Span<const int32_t> draft) {
  VerifiedDraft out;
  const bool logprobs = sampler.params().logprobs;
  for (size_t j = 0; j <= draft.size(); ++j) {
    TokenLogprob drawn;
    drawn.token =
        sampler.Sample(rows + static_cast<int64_t>(j) * vocab_size, logprobs ? &drawn : nullptr);
    if (j == draft.size() || drawn.token != draft[j]) {
      out.next = std::move(drawn);
      break;
    }
    out.accepted.push_back(std::move(drawn));
  }
  return out;
}

bool VerifiedOnHost(const StepItem& item) {
  if (item.sampler == nullptr || item.draft_tokens <= 0) return false;
  const Sampler& sampler = *item.sampler;
  const SamplingParams& p = sampler.params();
  const bool independent = !sampler.has_filter() && p.frequency_penalty == 0.0f &&
                           p.presence_penalty == 0.0f && p.repetition_penalty == 1.0f &&
                           p.logit_bias.empty() &&
                           static_cast<int64_t>(sampler.draws()) >= p.min_tokens;
  return !independent;
}

absl::Status CheckAcceptedDraft(const StepItem& item,
                                const std::unordered_map<int64_t, std::vector<int32_t>>& drafts) {
  if (item.accepted_draft.empty()) return absl::OkStatus();
  auto it = drafts.find(item.sequence);
  const size_t drafted = it == drafts.end() ? 0 : it->second.size();
  if (item.accepted_draft.size() > drafted ||
      !std::equal(item.accepted_draft.begin(), item.accepted_draft.end(), it->second.begin())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "step: sequence ", item.sequence, " accepts ", item.accepted_draft.size(),
        " drafted tokens that are not the start of its last step's draft of ", drafted));
  }
  return absl::OkStatus();
}

}  // namespace flotilla
