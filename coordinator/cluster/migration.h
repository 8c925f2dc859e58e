// What the ClusterManager keeps of one request so that it can continue on
// another instance: the request as checked, the tokens the client has been
// sent, and where it runs now. A continuation resubmits the prompt with those
// tokens as SubmitSequence.resume; the worker prefills them, counts them as
// generated (limits, penalties, the grammar's state, the sampler's draws) and
// streams only what follows, so the client sees one unbroken answer. Prompt
// logits cannot be resumed midway: a request moved while they stream asks for
// them all again and the rows already sent are dropped (NextSubmissionLocked).
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "coordinator/cluster/cluster_types.h"
#include "proto/cluster.pb.h"

namespace flotilla::coordinator {

struct TrackedRequest {
  uint64_t id = 0;                   // the id clients and Cancel use
  cluster::SubmitSequence request;   // as checked, without resume
  RequestCallbacks client;
  std::string route_key;
  absl::Time arrival;

  std::mutex mu;  // everything below
  int attempt = 0;        // bumped at each placement; callbacks of older ones are ignored
  int instance = -1;      // where it runs now (-1 while parked)
  uint64_t inner_id = 0;  // that instance's id for it; 0 while being placed
  std::vector<int32_t> output;  // tokens streamed to the client so far
  // Prompt logits (return_prompt_logits) the client has been sent, in floats,
  // and how many of the current attempt's first floats repeat them: a
  // request moved while its prompt logits stream starts over on the new
  // instance (the worker cannot resume them midway) and those are dropped.
  uint64_t prompt_logits_sent = 0;
  uint64_t prompt_logits_skip = 0;
  // The current attempt's repeated floats (its credit counts them too).
  uint64_t prompt_logits_repeated = 0;
  bool finished = false;
  std::optional<absl::Status> cancel;  // asked for while being placed
  absl::Time parked_until = absl::InfinitePast();
  // Metrics: the first token's time, the last one's, the finishing update.
  bool got_token = false;
  absl::Time last_token;
  std::optional<cluster::SequenceUpdate> finish;

  // Whether the request can continue elsewhere.
  bool ResumableLocked() const { return !finished; }
  // The SubmitSequence of the next attempt; sets prompt_logits_skip for it.
  // With tokens streamed the prompt's logits are all sent (they come first):
  // the continuation asks for none. Before that it asks for all of them
  // again, its credit window widened by what it repeats.
  cluster::SubmitSequence NextSubmissionLocked() {
    cluster::SubmitSequence s = request;
    prompt_logits_skip = prompt_logits_repeated = 0;
    if (!output.empty()) {
      s.mutable_resume()->mutable_output_ids()->Add(output.begin(), output.end());
      s.set_return_prompt_logits(false);
      s.clear_prompt_logits_credit_bytes();
    } else if (s.return_prompt_logits() && prompt_logits_sent > 0) {
      prompt_logits_skip = prompt_logits_sent;
      prompt_logits_repeated = prompt_logits_sent;
      if (s.prompt_logits_credit_bytes() != 0) {
        s.set_prompt_logits_credit_bytes(s.prompt_logits_credit_bytes() +
                                         prompt_logits_skip * sizeof(float));
      }
    }
    return s;
  }
};

}  // namespace flotilla::coordinator
