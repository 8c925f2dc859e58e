// One request's EAGLE3 drafting (speculative.h's "eagle3"), on the host: the
// head (worker/model/eagle3_head.h) run over the target's hidden states.
//
// Position i's input to the head is the embedded token i + 1 with fc of the
// target's states at i (the outputs of the head's aux layers), so it can be
// run once token i + 1 is known; its output predicts token i + 2. The head's
// K/V of those positions are kept (committed). Drafting from the last
// committed position P = length - 2: its output gives the first drafted
// token; each next one runs the head at the following position on the
// drafted token and the head's own previous output (state) instead of the
// target's, writing K/V that the next Propose drops again.
// Positions whose target states never came (a cached prompt prefix) are
// missing from the head's attention; drafting needs the state of position
// length - 2, else it proposes nothing.
// Not thread-safe: the scheduler's thread drives it.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "absl/types/span.h"
#include "kernels/cpu/thread_pool.h"
#include "worker/model/eagle3_head.h"

namespace flotilla::worker {

class Eagle3Drafter {
 public:
  // `head` (with an embedding) and `pool` (may be null) must outlive it.
  Eagle3Drafter(const Eagle3Head* head, kernels::cpu::ThreadPool* pool);

  // The target's states of positions [first, first + n): n rows of
  // aux_layers x target_hidden_size floats (StepOutput::hidden's layout),
  // each computed from the sequence's real tokens.
  void AddHidden(int64_t first, const float* rows, int64_t n);

  // At most k tokens to follow `tokens` (the whole sequence: prompt and
  // output), greedy under the head; empty without the state of position
  // tokens.size() - 2.
  std::vector<int32_t> Propose(absl::Span<const int32_t> tokens, int k);

  // Positions whose K/V the head keeps from the target's states.
  int64_t committed() const { return static_cast<int64_t>(committed_); }

 private:
  // Runs the head's layer on rows at `positions` (ascending, after every
  // committed position): the embedded `tokens` with `state` [n, H] in,
  // K/V appended, the pre-norm outputs [n, H] into `out`.
  void RunLayer(const std::vector<int64_t>& positions, const std::vector<int32_t>& tokens,
                const std::vector<float>& state, std::vector<float>* out);
  // Attention of the rows' queries q [n, heads, D] over the kept K/V, causal by position.
  void Attend(const std::vector<int64_t>& positions, const std::vector<float>& q,
              std::vector<float>* out) const;
  // Runs the pending states whose next token `tokens` holds, committing them.
  void Commit(absl::Span<const int32_t> tokens);
  // The target id of the head's most likely draft token after output `state`.
  int32_t DraftToken(const float* state);

  const Eagle3Head* head_;
  kernels::cpu::ThreadPool* pool_;
  std::vector<float> inv_freq_;
  float rope_scaling_ = 1.0f;
  // K/V rows [kv_heads * D] and their positions: committed ones first, then
  // the last Propose's drafted ones.
  std::vector<int64_t> kv_positions_;
  std::vector<float> k_, v_;
  size_t committed_ = 0;
  std::map<int64_t, std::vector<float>> pending_;  // target states by position
  int64_t last_ = -1;                              // last committed position
  std::vector<float> last_out_;                    // the head's output there
};

}  // namespace flotilla::worker
