#include "worker/engine/draft_verify.h"

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

}  // namespace flotilla
