// One request's drafter for speculative decoding, whichever method it chose
// (speculation.h): prompt lookup (ngram_drafter.h), suffix decoding
// (suffix_drafter.h), an EAGLE3 head (eagle3_drafter.h) or the
// benchmark-only replay (replay_drafter.h). What
// drafters remember across requests, the recent outputs suffix decoding
// searches and replay's recordings, is the worker's DraftMemory, shared by
// its requests and kept when its scheduler is rebuilt.
// Not thread-safe: the scheduler's thread drives it.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/types/span.h"
#include "kernels/cpu/thread_pool.h"
#include "worker/eagle3_drafter.h"
#include "worker/engine/sampler.h"
#include "worker/model/eagle3_head.h"
#include "worker/replay_drafter.h"
#include "worker/speculation.h"
#include "worker/suffix_drafter.h"

namespace flotilla::worker {

struct DraftMemory {
  SuffixIndex recent_outputs;   // suffix: the outputs finished lately (bounded)
  ReplayRecordings recordings;  // replay: deterministic requests' outputs (bounded)
  // eagle3: the worker's head (--speculative-model; null: none), run on the
  // host with `pool` (may be null) between steps.
  std::shared_ptr<const Eagle3Head> eagle3;
  kernels::cpu::ThreadPool* pool = nullptr;
};

class SpeculativeDrafter {
 public:
  // A drafter for a request of `prompt` sampled with `params`, drafting by
  // `config`; `salt` varies replay's errors between requests. `memory` must
  // outlive it.
  SpeculativeDrafter(const SpeculativeConfig& config, DraftMemory* memory,
                     absl::Span<const int32_t> prompt, const SamplingParams& params, uint64_t salt,
                     int vocab);

  // At most min(config.num_tokens, limit) tokens to follow the request's
  // prompt and `generated` output; empty when nothing is proposed.
  std::vector<int32_t> Propose(absl::Span<const int32_t> generated, int64_t limit);
  // The request ended with `generated` (a stop or its length): suffix
  // decoding's recent outputs learn it, and replay's recordings when the
  // worker allows replay (whatever method the request chose).
  void Finish(absl::Span<const int32_t> generated);

  // eagle3: whether steps return the target's hidden states for it, and
  // their valid rows: positions [first, first + n) of the sequence.
  bool WantsHidden() const { return eagle3_ != nullptr; }
  void AddHidden(int64_t first, const float* rows, int64_t n);

  const SpeculativeConfig& config() const { return config_; }

 private:
  SpeculativeConfig config_;
  DraftMemory* memory_;
  std::vector<int32_t> context_;  // the prompt, then the output as Propose saw it
  size_t prompt_size_ = 0;
  uint64_t replay_key_ = 0;
  uint64_t salt_ = 0;
  int vocab_ = 0;
  std::unique_ptr<SuffixIndex> own_;       // suffix: the request's prompt and output
  std::unique_ptr<Eagle3Drafter> eagle3_;  // eagle3 (memory has a head)
};

}  // namespace flotilla::worker
