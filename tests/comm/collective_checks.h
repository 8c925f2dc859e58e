// Every collective of a host-memory Communicator checked against values each
// rank can compute by itself. Shared by the threaded (local) tests and the
// separate processes of the UCX tests, so both backends pass the same checks.
#pragma once

#include "absl/status/status.h"
#include "comm/communicator.h"

namespace flotilla::comm::testing {

// Runs barrier, broadcast (every root), all-gather (also in place), f32 and
// bf16 all-reduce, uneven and zero all-to-all, count exchange and argument
// errors. All ranks must call it together. Returns the first mismatch.
absl::Status RunCollectiveChecks(Communicator& comm);

}  // namespace flotilla::comm::testing
