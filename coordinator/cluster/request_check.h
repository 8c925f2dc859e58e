// Checks of a request that hold whatever the state of the instances: a
// malformed request is the client's error even while no worker is alive.
#pragma once

#include "absl/status/status.h"
#include "coordinator/cluster/cluster_types.h"
#include "proto/cluster.pb.h"

namespace flotilla::coordinator {

// INVALID_ARGUMENT naming what is wrong: an empty prompt or a token outside
// the vocabulary, a sampling field (common/sampling_check.h), a prompt plus
// max_tokens over the context (cut to fit when the request asked to be
// truncated), prompt logits over the server's bound.
absl::Status CheckSubmission(cluster::SubmitSequence& request, const ClusterOptions& options);

}  // namespace flotilla::coordinator
