// Request migration on the worker: a SubmitSequence with `resume` carries the
// tokens the request already streamed from the instance that ran it before.
// The scheduler prefills them after the prompt as context, streams only the
// tokens after them, and first brings the request's sampling state to where
// the first instance left it: these functions check the resumed output
// against the request and replay it through the sampler (penalty counts,
// min_tokens, the draw count that indexes the seeded random stream) and the
// structured-output constraint.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "proto/cluster.pb.h"
#include "worker/constraint_filter.h"
#include "worker/engine/sampler.h"

namespace flotilla::worker {

// INVALID_ARGUMENT, naming the field, when `submit.resume` cannot continue
// the request: with return_prompt_logits (those were streamed before the
// request moved), a token outside [0, vocab_size), one of the request's
// `stop_ids` (a stop token ends a request and is never streamed), or as many
// tokens as `max_tokens` allows in all (nothing is left to generate). OK
// when `submit` has no resume.
absl::Status CheckResume(const cluster::SubmitSequence& submit, const std::vector<int>& stop_ids,
                         int64_t max_tokens, int vocab_size);

// Records `output` on `sampler` token by token, as if it had drawn them.
// `constraint` (null: none) is the filter set on the sampler; a token it
// refuses is INVALID_ARGUMENT naming its position in resume.output_ids.
absl::Status ReplayOutput(const std::vector<int32_t>& output, Sampler& sampler,
                          const ConstraintFilter* constraint);

}  // namespace flotilla::worker
