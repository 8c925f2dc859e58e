// What one rank of a device context test does: steps of Dispatch, the fake
// experts and Combine over every layer, TP all-reduces, and the same
// captured in a CUDA graph and replayed with new data; each result checked
// against the host reference (exchange_reference.h), bit for bit. All ranks
// of the scenario must run the same checks together.
#pragma once

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "tests/parallel/exchange_reference.h"
#include "worker/parallel/parallel_context.h"

namespace flotilla::parallel::testing {

// `steps` steps with uneven (and empty) token counts per DP group.
absl::Status CheckSteps(const Scenario& s, ParallelContext& context, int steps,
                        cudaStream_t stream);

// All-reduces of 0, 1, 7, a few rows and more than one round of elements.
absl::Status CheckAllReduces(const Scenario& s, ParallelContext& context, cudaStream_t stream);

// Dispatch, fake experts, Combine and an all-reduce captured once and
// replayed twice with different inputs.
absl::Status CheckGraphReplays(const Scenario& s, ParallelContext& context, cudaStream_t stream);

// A projection summed over the TP group inside its own launch
// (kernels::cuda::LaunchLinearTpSum) against the projection and AllReduceAdd
// apart, bit for bit, at 1, 3 and 8 tokens; with every other TP rank running
// the separate form (peers may run either); and both captured in a graph and
// replayed. Over CUDA IPC with TP > 1 and a GPU per rank the context must
// offer it; elsewhere (ranks sharing a GPU included) the check only confirms
// that it does not.
absl::Status CheckLinearTpSum(const Scenario& s, ParallelContext& context, cudaStream_t stream);

}  // namespace flotilla::parallel::testing
