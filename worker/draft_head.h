// The worker's EAGLE3 head (--speculative-model, or the coordinator's): read
// for the target the worker serves and given the token embedding it needs
// (its own embed_tokens, else the target's).
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/model/eagle3_head.h"
#include "worker/model/model_source.h"
#include "worker/model/weights.h"

namespace flotilla::worker {

// The head `spec` names (a directory or synthetic:eagle3[:SEED]) for
// `model`. A head without embed_tokens embeds with `host_weights.embed`, or,
// when the shard was not loaded into host memory, a synthetic target's
// embedding generated here; FAILED_PRECONDITION for a checkpoint target
// whose embedding is not in host memory. Errors start with
// "--speculative-model SPEC: ".
absl::StatusOr<std::shared_ptr<const Eagle3Head>> LoadDraftHead(const std::string& spec,
                                                                const ModelSource& model,
                                                                const ModelWeights& host_weights);

}  // namespace flotilla::worker
