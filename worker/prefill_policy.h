// How a step's token budget left after the decode tokens is split among the
// prompts still being prefilled (chunked prefill). The scheduler gives every
// running sequence past its prompt one decode token first, then asks this
// policy which prompts get a chunk and how large; the policy only orders and
// sizes, it never touches a sequence.
//
// The rules, in order (worker/README.md, "Scheduling policy"):
//  1. Order the prompts: `kFcfs` by arrival; `kShortestPromptFirst` by the
//     tokens each has left to compute (a prompt not yet started: its whole
//     length), except that a prompt waiting `max_prefill_wait_ms` or longer
//     since it arrived goes before every other, in arrival order (so a long
//     prompt is delayed by shorter ones for at most that long).
//  2. Walk that order giving each prompt min(left, budget left) tokens, at
//     most `long_prefill_token_threshold` for a long prompt (longer than the
//     threshold), with at most `max_partial_prefills` prompts in the step and
//     at most `max_long_partial_prefills` long ones among them.
//  3. Budget still left goes back to the prompts already given a chunk, in
//     the same order, up to what each has left (a capped long prompt alone
//     in the step still uses the whole budget: the cap only makes room).
// The names follow vLLM's options where one exists.
#pragma once

#include <cstdint>
#include <functional>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/cluster.pb.h"

namespace flotilla::worker {

enum class PrefillOrder {
  kFcfs,                 // first come, first served
  kShortestPromptFirst,  // fewest prompt tokens left first, within max_prefill_wait_ms
};

// "fcfs" or "shortest-prompt-first" (the flag's values); INVALID_ARGUMENT
// naming the value otherwise.
absl::StatusOr<PrefillOrder> ParsePrefillOrder(std::string_view name);
std::string_view PrefillOrderName(PrefillOrder order);

struct PrefillPolicy {
  PrefillOrder order = PrefillOrder::kFcfs;
  int64_t max_partial_prefills = 0;          // prompts given a chunk in one step; 0 = no bound
  int64_t max_long_partial_prefills = 0;     // of them, long prompts; 0 = no bound
  int64_t long_prefill_token_threshold = 0;  // a prompt longer than this is long; 0 = none is
  uint64_t max_prefill_wait_ms = 0;          // kShortestPromptFirst's bound; 0 = none
};

// The Assignment's policy; an order value this build does not know is
// refused with INVALID_ARGUMENT naming it. UNSPECIFIED is first come, first
// served.
absl::StatusOr<PrefillPolicy> PrefillPolicyFromProto(const cluster::SchedulerPolicy& proto);

// A prompt with tokens left to prefill.
struct PrefillCandidate {
  uint64_t request_id = 0;
  uint64_t arrived_ms = 0;  // when it was queued (the scheduler's clock)
  int64_t prompt_tokens = 0;
  int64_t left = 0;         // prompt tokens still to compute (> 0)
};

// One prompt's chunk in the step.
struct PrefillChunk {
  size_t candidate = 0;  // index into the candidates
  int64_t tokens = 0;    // > 0
};

// The chunks of one step for `candidates` within `budget` tokens at time
// `now_ms`, in the order the policy serves them. `left` of a candidate may
// change while the plan is made (a prompt not yet started starts after its
// cached prefix): `left_of(i)` is asked right before candidate i is given
// its first tokens and must return its real remainder (> 0, or 0 to skip it).
std::vector<PrefillChunk> PlanPrefill(const PrefillPolicy& policy,
                                      const std::vector<PrefillCandidate>& candidates,
                                      int64_t budget, uint64_t now_ms,
                                      const std::function<int64_t(size_t)>& left_of);

}  // namespace flotilla::worker
