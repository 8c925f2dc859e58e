// Verification of drafted tokens (speculative decoding), the same on every
// engine: the model's token at each drafted position is drawn with the
// request's sampler exactly as a step without speculation draws it, and a
// drafted token is accepted when the draw equals it.
//
// Greedy requests: a draft is accepted while the model's argmax equals it,
// so the output is token for token the output without speculation.
// Sampled requests: the draw at a position is the inverse CDF of the
// sampler's uniform for that draw (Sampler: the value depends only on the
// seed and the draw count). The draft d is accepted exactly when the draw
// lands on d, which has probability p(d); otherwise the token drawn is
// distributed as p with d removed and renormalised. That is the
// speculative-sampling rule for a deterministic draft, with the two random
// choices coupled through one uniform, so the target distribution is kept
// and a seeded request gives the same tokens with speculation on or off.
// Penalties, logit_bias, min_tokens and a structured-output filter apply at
// every position (the sampler records each accepted token before the next
// draw): a drafted token the filter refuses is never drawn, so it is
// rejected.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "worker/engine/engine.h"
#include "worker/engine/sampler.h"

namespace flotilla {

struct VerifiedDraft {
  std::vector<TokenLogprob> accepted;  // the drafted tokens accepted, in order
  TokenLogprob next;                   // the token drawn after them
};

// `rows`: the model's logits [draft.size() + 1][vocab_size], row j at the
// position whose next token is draft[j] (the last row follows the whole
// draft). Draws at most draft.size() + 1 tokens with `sampler` (each
// recorded in it); logprobs when its parameters ask for them.
VerifiedDraft VerifyDraft(Sampler& sampler, const float* rows, int64_t vocab_size,
                          absl::Span<const int32_t> draft);

// Whether an engine that draws on a device verifies `item` on the host
// instead (VerifyDraft over its logit rows): it brings a drafted chunk and
// its sampler's draws depend on the tokens drawn before them (a penalty,
// logit_bias, min_tokens still in force, or a token filter), so the device
// cannot draw its rows at once (the j-th with the draw draws() + j). The
// rule is per item: the step's other items keep the device's draws, as in a
// step without drafts. (A seeded request's device draws, Philox, are not
// the host sampler's, so moving it to the host would change its tokens.)
bool VerifiedOnHost(const StepItem& item);

// OK when `item` accepts nothing or accepts the start of the draft its
// sequence's last step brought (`drafts`: each sequence's last draft, as the
// engine keeps them); else INVALID_ARGUMENT naming both lengths.
absl::Status CheckAcceptedDraft(const StepItem& item,
                                const std::unordered_map<int64_t, std::vector<int32_t>>& drafts);

}  // namespace flotilla
