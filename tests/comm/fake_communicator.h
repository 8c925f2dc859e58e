// A scriptable Communicator for runtime tests (test-only target
// flotilla_comm_fake): it records every call and returns scripted failures in
// a chosen order, so failure paths of the worker become ordinary unit tests.
//
// Data moves either through a wrapped real communicator (e.g. a
// LocalCommunicator, to run a whole group in one process) or, standalone, as
// if every peer echoed this rank: AllReduce gives size() times the input,
// AllGather repeats this rank's block, Broadcast keeps the buffer, and
// AllToAllV receives from peer p what this rank sent to p.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "comm/communicator.h"

namespace flotilla::comm::testing {

enum class CommOp { kAllReduce, kAllGather, kBroadcast, kAllToAllV, kExchangeCounts, kBarrier };

struct CommCall {
  CommOp op;
  int index;         // position among all calls to this fake, from 0
  size_t bytes = 0;  // payload this rank sends (AllToAllV: the sum of its counts)
  int root = -1;     // Broadcast only
};

class FakeCommunicator final : public Communicator {
 public:
  // Standalone rank `rank` of a group of `size` (echoing peers, see above).
  FakeCommunicator(int rank, int size);
  // Forwards every call that the script lets through to `inner`.
  explicit FakeCommunicator(std::unique_ptr<Communicator> inner);

  // The `nth` call (from 0) of `op` returns `status` without moving data.
  void FailNth(CommOp op, int nth, absl::Status status);
  // Every call from the `index`-th (over all ops) returns `status`, as after a
  // peer has died.
  void FailFrom(int index, absl::Status status);
  // Runs before each call (after the scripted failures); a non-ok status is
  // returned instead of moving data. Lets a test block, count or fail calls.
  void SetHook(std::function<absl::Status(const CommCall&)> hook);
  // Every call made so far, in order.
  std::vector<CommCall> calls() const;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  absl::Status AllReduce(void* buffer, size_t count, DataType type,
                         void* stream = nullptr) override;
  absl::Status AllGather(const void* send, void* recv, size_t bytes_per_rank,
                         void* stream = nullptr) override;
  absl::Status Broadcast(void* buffer, size_t bytes, int root, void* stream = nullptr) override;
  absl::Status AllToAllV(const void* send, absl::Span<const size_t> send_counts,
                         absl::Span<const size_t> send_offsets, void* recv,
                         absl::Span<const size_t> recv_counts,
                         absl::Span<const size_t> recv_offsets, void* stream = nullptr) override;
  absl::Status ExchangeCounts(absl::Span<const size_t> send_counts,
                              absl::Span<size_t> recv_counts) override;
  absl::Status Barrier(void* stream = nullptr) override;
  // Passed on to the wrapped communicator (a standalone fake never waits).
  void SetTimeout(absl::Duration timeout) override {
    if (inner_) inner_->SetTimeout(timeout);
  }

 private:
  // Records the call and applies the script; ok means "go ahead".
  absl::Status Script(CommOp op, size_t bytes, int root = -1);

  std::unique_ptr<Communicator> inner_;
  const int rank_;
  const int size_;
  mutable absl::Mutex mu_;
  std::vector<CommCall> calls_ ABSL_GUARDED_BY(mu_);
  std::vector<int> per_op_count_ ABSL_GUARDED_BY(mu_) = std::vector<int>(6, 0);
  struct NthFailure {
    CommOp op;
    int nth;
    absl::Status status;
  };
  std::vector<NthFailure> nth_failures_ ABSL_GUARDED_BY(mu_);
  int fail_from_ ABSL_GUARDED_BY(mu_) = -1;
  absl::Status fail_from_status_ ABSL_GUARDED_BY(mu_);
  std::function<absl::Status(const CommCall&)> hook_ ABSL_GUARDED_BY(mu_);
};

}  // namespace flotilla::comm::testing
