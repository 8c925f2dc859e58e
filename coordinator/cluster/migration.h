// What the ClusterManager keeps of one request so that it can continue on
// another instance: the request as checked, the tokens the client has been
// sent, and where it runs now. A continuation resubmits the prompt with those
// tokens as SubmitSequence.resume; the worker prefills them, counts them as
// generated (limits, penalties, the grammar's state, the sampler's draws) and
// streams only what follows, so the client sees one unbroken answer.
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
  std::vector<int32_t> output;      // tokens streamed to the client so far
  bool prompt_logits_sent = false;  // prompt logits cannot be resumed midway
  bool finished = false;
  std::optional<absl::Status> cancel;  // asked for while being placed
  absl::Time parked_until = absl::InfinitePast();
  // Metrics: the first token's time, the last one's, the finishing update.
  bool got_token = false;
  absl::Time last_token;
  std::optional<cluster::SequenceUpdate> finish;

  // Whether the request can continue elsewhere.
  bool ResumableLocked() const { return !prompt_logits_sent && !finished; }
  // The SubmitSequence of the next attempt.
  cluster::SubmitSequence NextSubmissionLocked() const {
    cluster::SubmitSequence s = request;
    if (!output.empty()) {
      s.mutable_resume()->mutable_output_ids()->Add(output.begin(), output.end());
    }
    return s;
  }
};

}  // namespace flotilla::coordinator
