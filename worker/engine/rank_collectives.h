// The points where a layer's work is split across ranks. The engine computes
// only what its rank holds (its attention heads, its experts) and calls these
// hooks to complete the layer; a distributed runtime implements them over a
// communicator. With one rank holding everything no hooks are needed: the
// engine is created with none and the partial results are already complete.
#pragma once

#include <cstdint>

#include "absl/status/status.h"

namespace flotilla {

class RankCollectives {
 public:
  virtual ~RankCollectives() = default;

  // Sums, in place and across the ranks of this rank's tensor-parallel group,
  // the partial o_proj outputs [tokens, hidden] (the rank holding q head 0
  // has already added o_proj's bias to its part).
  virtual absl::Status AllReduceAttention(int layer, float* data, int64_t count) = 0;

  // Completes the MoE output [tokens, hidden]: `data` holds, for this rank's
  // tokens, the router-weighted sum over the experts this rank holds; after the
  // call it holds the sum over all experts (e.g. all-to-all dispatch/combine,
  // or an all-reduce when every rank sees the same tokens).
  virtual absl::Status CombineExperts(int layer, float* data, int64_t count) = 0;
};

}  // namespace flotilla
