// The one wrapper of NCCL communicators in the tree: the world communicator
// of a group of ranks and, optionally, one child split off it (the tensor-
// parallel group of the device transport, nccl_transport.h), with every wait
// bounded.
//
// Communicators are non-blocking (ncclConfig_t::blocking = 0), so forming
// the group, the split and every enqueue have a deadline (`timeout`), cut
// short by `interrupt`. Any failure breaks both communicators for good:
// broken() says why, later Settle()s and Health() return it, and the
// destructor aborts them instead of finalizing. A dead peer leaves NCCL's
// kernels waiting for good (over its socket transport the proxy sees the
// connection close, the kernels do not): Health() reports NCCL's
// asynchronous errors, and Abort() (ncclCommAbort) makes the kernels exit.
// The caller makes its CUDA device current before Create and every call.
//
// Environment: NCCL reads its NCCL_* variables (keep NCCL_NVLS_ENABLE=0
// where NVLink multicast must stay off).
#pragma once

#include <atomic>
#include <memory>
#include <optional>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "comm/communicator.h"

// NCCL's handle, so that this header does not include NCCL or CUDA.
typedef struct ncclComm* ncclComm_t;

namespace flotilla::comm {

// ncclCommSplit's arguments for this rank: ranks with the same color form
// one child, ordered by key. `name` says what the child is in errors.
struct NcclSplit {
  int color = 0;
  int key = 0;
  std::string name = "child communicator";
};

class NcclComms {
 public:
  // Rank 0 of `host` makes the unique id and broadcasts it over `host`;
  // every rank joins the world communicator (host.size() ranks) and, with
  // `split`, the child. `interrupt` (may be null), once true, ends every
  // wait at once.
  static absl::StatusOr<std::unique_ptr<NcclComms>> Create(
      Communicator& host, std::optional<NcclSplit> split, absl::Duration timeout,
      std::shared_ptr<const std::atomic<bool>> interrupt = nullptr);
  // Finalizes the communicators (aborts them when broken or when finalizing
  // does not finish in time).
  ~NcclComms();
  NcclComms(const NcclComms&) = delete;
  NcclComms& operator=(const NcclComms&) = delete;

  ncclComm_t world() const { return world_; }
  // The split-off child; null without a split (or after Abort()).
  ncclComm_t child() const { return child_; }
  // Ok, or why the communicators are unusable.
  const absl::Status& broken() const { return broken_; }

  // Waits out ncclInProgress of a non-blocking call's `result` on `comm`;
  // a failure (or the timeout, or the interrupt) breaks the communicators.
  absl::Status Settle(ncclComm_t comm, int result, const char* what);
  // ncclGroupStart, `post` (the group's ncclSend/ncclRecv calls), then
  // ncclGroupEnd settled on the world communicator.
  absl::Status Group(absl::FunctionRef<void()> post, const char* what);
  // broken(), else NCCL's asynchronous errors of either communicator.
  absl::Status Health();
  // ncclCommAbort on both (NCCL's kernels waiting for a peer exit and the
  // stream moves on); every later call fails. A communicator must not be
  // captured in a live CUDA graph: NCCL's abort waits for such graphs to go.
  void Abort();

 private:
  NcclComms(absl::Duration timeout, std::shared_ptr<const std::atomic<bool>> interrupt)
      : timeout_(timeout), interrupt_(std::move(interrupt)) {}
  absl::Status Form(Communicator& host, const std::optional<NcclSplit>& split);

  absl::Duration timeout_;
  std::shared_ptr<const std::atomic<bool>> interrupt_;
  ncclComm_t world_ = nullptr;
  ncclComm_t child_ = nullptr;
  absl::Status broken_;
};

}  // namespace flotilla::comm
