// Which GPU each worker of `flotilla up --device cuda` runs on.
#pragma once

#include <vector>

#include "absl/status/statusor.h"

namespace flotilla::cli {

// CUDA devices this process sees (CUDA_VISIBLE_DEVICES applied; children
// inherit the same view). FAILED_PRECONDITION, saying why, when the build has
// no CUDA or no GPU is visible: `up` stops before starting any process.
absl::StatusOr<int> VisibleGpus();

// The CUDA ordinal of each of `workers` workers: worker i gets
// gpus[i % gpus.size()], so that several workers share a GPU when there are
// more workers than GPUs. `requested` are the ordinals to use (--gpus; empty =
// all `visible` ones); each must be visible and named once.
absl::StatusOr<std::vector<int>> AssignWorkerGpus(int workers, const std::vector<int>& requested,
                                                  int visible);

}  // namespace flotilla::cli
