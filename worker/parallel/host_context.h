// A ParallelContext on host memory (Memory::kHost, f32) over a
// comm::Communicator spanning the instance (local threads in tests, UCX
// between processes): CPU ranks.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "comm/communicator.h"
#include "worker/parallel/parallel_context.h"

namespace flotilla::parallel {

// `comm` spans all ranks (comm->rank() is this rank) and outlives the context.
absl::StatusOr<std::unique_ptr<ParallelContext>> CreateHostContext(const ParallelConfig& config,
                                                                   ExpertMap map,
                                                                   comm::Communicator* comm,
                                                                   const ContextOptions& options);

}  // namespace flotilla::parallel
