// The benchmark-only replay drafter (--speculative-method replay): random
// weights accept almost no real draft, so a benchmark that charts speedup
// against acceptance length needs a drafter whose acceptance it controls.
// This one proposes what an earlier identical request (same prompt, same
// deterministic sampling: greedy or seeded) produced on this worker, which
// the model accepts, and replaces each drafted token by another with a
// chosen probability (the error rate), which the model rejects. Production
// never uses it by accident: choosing it needs --allow-replay-drafter.
#pragma once

#include <cstdint>
#include <deque>
#include <unordered_map>
#include <vector>

#include "absl/types/span.h"
#include "worker/engine/sampler.h"

namespace flotilla::worker {

// The key of a request's recording: its prompt and what decides its output
// (temperature, top-k/p, min-p, seed, penalties, bias). 0 when the output is
// not deterministic (sampled without a seed): such requests are not recorded.
uint64_t ReplayKey(absl::Span<const int32_t> prompt, const SamplingParams& params);

// The outputs of finished deterministic requests, by ReplayKey, the oldest
// forgotten first past `max_tokens` tokens in all (bounded memory).
class ReplayRecordings {
 public:
  explicit ReplayRecordings(int64_t max_tokens = int64_t{1} << 22) : max_tokens_(max_tokens) {}

  // Keeps `output` for `key` (a later recording of the key replaces it);
  // nothing for key 0 or an output longer than the bound.
  void Record(uint64_t key, absl::Span<const int32_t> output);
  // The recording of `key`; null when there is none.
  const std::vector<int32_t>* Find(uint64_t key) const;

  int64_t tokens() const { return tokens_; }
  size_t size() const { return outputs_.size(); }

 private:
  int64_t max_tokens_;
  int64_t tokens_ = 0;
  std::unordered_map<uint64_t, std::vector<int32_t>> outputs_;
  std::deque<uint64_t> order_;  // keys, oldest first (a replaced key appears again)
};

// Up to `k` tokens of `recorded` after the request's `generated` output,
// when `generated` is where the recording went (else none); each replaced,
// with probability `error_rate`, by another token of [0, vocab). The
// replacement is a pure function of (salt, position), so a run is
// reproducible.
std::vector<int32_t> ProposeReplayDraft(const std::vector<int32_t>& recorded,
                                        absl::Span<const int32_t> generated, int k,
                                        double error_rate, uint64_t salt, int vocab);

// The mean tokens a verification step gives (the accepted drafted ones and
// the one drawn after them) when each of `k` drafted tokens is wrong with
// probability `error_rate` independently and the rest are the model's own:
// 1 + sum_{i=1..k} (1 - error_rate)^i.
double ExpectedReplayAcceptanceLength(double error_rate, int k);

// The error rate giving `acceptance_length` (in [1, k + 1]) with `k` drafted
// tokens (bisection of ExpectedReplayAcceptanceLength).
double ReplayErrorRateFor(double acceptance_length, int k);

}  // namespace flotilla::worker
