// The points where a layer's work is split across ranks. The engine computes
// only what its rank holds (its attention heads, its experts) and calls these
// hooks to complete the layer; a distributed runtime implements them over a
// communicator. With one rank holding everything no hooks are needed: the
// engine is created with none and the partial results are already complete.
#pragma once

#include <cstdint>

#include "absl/status/status.h"

namespace flotilla {

// The experts this rank holds, as the MoE hook calls them.
class LocalExperts {
 public:
  virtual ~LocalExperts() = default;
  // Runs expert experts[i] (which this rank must hold) on row i of `rows`
  // [n, hidden]; writes that expert's output (down-projection bias included,
  // not yet weighted by the router) to row i of `out` [n, hidden].
  virtual absl::Status Run(int layer, const float* rows, int64_t n, const int32_t* experts,
                           float* out) = 0;
};

class RankCollectives {
 public:
  virtual ~RankCollectives() = default;

  // Sums, in place and across the ranks of this rank's tensor-parallel group,
  // the partial o_proj outputs [tokens, hidden] (o_proj's bias is already in
  // the partial of the rank holding q head 0).
  virtual absl::Status AllReduceAttention(int layer, float* data, int64_t count) = 0;

  // When true the engine hands the whole MoE block to RunMoe (token dispatch
  // to the ranks holding each token's experts, and the weighted combine);
  // otherwise it runs the experts it holds on its own tokens and completes the
  // sum with CombineExperts.
  virtual bool DispatchesTokens() const { return false; }

  // Completes the MoE output [tokens, hidden]: `data` holds the router-weighted
  // sum over the experts this rank holds; after the call, the sum over all.
  virtual absl::Status CombineExperts(int layer, float* data, int64_t count) {
    return absl::UnimplementedError("CombineExperts: this runtime dispatches tokens");
  }

  // The whole MoE block for this rank's `tokens` rows: `normed` [tokens,
  // hidden] are the post-attention-normed hidden states, topk_idx/topk_w
  // [tokens, k] the router's choice (weights already softmaxed). Writes
  // y[t] = sum over the k experts, in ascending expert order, of w * expert(t).
  virtual absl::Status RunMoe(int layer, const float* normed, int64_t tokens, int64_t hidden,
                              const int32_t* topk_idx, const float* topk_w, int k,
                              LocalExperts& local, float* y) {
    return absl::UnimplementedError("RunMoe: this runtime combines per-rank partial sums");
  }
};

}  // namespace flotilla
