// The one check of a request's sampling parameters, run by the coordinator
// for every API (gRPC Generate and Chat, the HTTP routes) before it asks
// whether the instance can take the request: a malformed request is
// INVALID_ARGUMENT whether or not any worker is alive. Workers check again
// (worker/engine/sampler.cc) since they also serve the in-process engine.
#pragma once

#include "absl/status/status.h"
#include "proto/common.pb.h"

namespace flotilla {

// INVALID_ARGUMENT naming the first field of `sampling` (as
// "sampling.<field>") that is out of its documented range (proto/common.proto)
// for a vocabulary of `vocab_size` tokens.
absl::Status CheckSamplingParams(const common::SamplingParams& sampling, int vocab_size);

}  // namespace flotilla
