// Credit for the prompt logits of one client stream (gRPC Generate with
// return_prompt_logits). A prompt's logits are large (vocab x 4 bytes a
// token: 786 KiB for gpt-oss) and a worker computes them faster than most
// clients read, so each sequence may send only `window` bytes of them ahead
// of what its client has taken; its DP-group leader plans no prompt rows
// beyond that (SubmitSequence.prompt_logits_credit_bytes, then
// PromptLogitsCredit messages), and the sequence pauses on the worker, its
// KV kept, instead of filling the coordinator. As the client takes each
// message, Taken says how far the sequence may now go.
//
// The stream's bound still applies (client_buffers.h): a stream whose
// sequence waits (`waiting`) while its client takes nothing for the stall
// grace is ended and its request cancelled.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>

namespace flotilla::coordinator {

class PromptLogitsCredit {
 public:
  // `window`: bytes each sequence may send ahead of its client (at least 1;
  // the worker always sends whole rows, at least one at a time).
  explicit PromptLogitsCredit(uint64_t window) : window_(window == 0 ? 1 : window) {}

  // The credit a sequence starts with (SubmitSequence.prompt_logits_credit_bytes).
  uint64_t window() const { return window_; }

  // An update of `sequence` arrived with `bytes` of prompt logits (queued for
  // the client); `prompt_done`: its prompt logits are complete (the update
  // carries a token or ends the sequence).
  void Received(uint64_t sequence, uint64_t bytes, bool prompt_done);
  // The client took `bytes` of `sequence`'s prompt logits: the credit to send
  // its leader now (the bytes it may have sent in all), or 0 when it has not
  // grown.
  uint64_t Taken(uint64_t sequence, uint64_t bytes);
  // Whether a sequence waits for the client: it has sent all its credit and
  // its prompt logits are not complete.
  bool waiting() const;

 private:
  struct Sequence {
    uint64_t received = 0;
    uint64_t taken = 0;
    uint64_t granted = 0;  // the credit as last sent (0: the window)
    bool done = false;
  };
  bool WaitingLocked(const Sequence& sequence) const;

  const uint64_t window_;
  mutable std::mutex mu_;
  std::map<uint64_t, Sequence> sequences_;  // under mu_
};

}  // namespace flotilla::coordinator
