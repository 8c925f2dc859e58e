#include "comm/nccl/nccl_comms.h"

#include <nccl.h>

#include <thread>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace flotilla::comm {
namespace {

absl::Status NcclError(ncclResult_t r, absl::string_view what) {
  return absl::UnavailableError(absl::StrCat("nccl: ", what, ": ", ncclGetErrorString(r)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<NcclComms>> NcclComms::Create(
    Communicator& host, std::optional<NcclSplit> split, absl::Duration timeout,
    std::shared_ptr<const std::atomic<bool>> interrupt) {
  if (timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("nccl: the timeout must be positive");
  }
  std::unique_ptr<NcclComms> comms(new NcclComms(timeout, std::move(interrupt)));
  FLOTILLA_RETURN_IF_ERROR(comms->Form(host, split));
  return comms;
}

absl::Status NcclComms::Form(Communicator& host, const std::optional<NcclSplit>& split) {
  ncclUniqueId id;
  if (host.rank() == 0) {
    const ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) return NcclError(r, "ncclGetUniqueId");
  }
  FLOTILLA_RETURN_IF_ERROR(host.Broadcast(&id, sizeof(id), 0));
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;  // every wait below has a deadline
  const ncclResult_t init = ncclCommInitRankConfig(&world_, host.size(), id, host.rank(), &cfg);
  FLOTILLA_RETURN_IF_ERROR(Settle(world_, init, "ncclCommInitRankConfig"));
  if (!split.has_value()) return absl::OkStatus();
  const ncclResult_t result = ncclCommSplit(world_, split->color, split->key, &child_, &cfg);
  if (result != ncclSuccess && result != ncclInProgress) {
    return Settle(world_, result, "ncclCommSplit");
  }
  // On a non-blocking parent, ncclCommSplit returns ncclSuccess while the
  // child is still being built on NCCL's group thread: the parent reads
  // ncclInProgress until then, and `child_` is stored just before the parent
  // settles. So wait on the parent whatever the split returned; trusting its
  // return left `child_` null on distinct GPUs, where building takes longer.
  FLOTILLA_RETURN_IF_ERROR(Settle(world_, ncclInProgress, "ncclCommSplit"));
  if (child_ == nullptr) {
    broken_ = absl::UnavailableError(absl::StrCat("nccl: ncclCommSplit gave no ", split->name));
    return broken_;
  }
  const std::string what = absl::StrCat("ncclCommSplit (", split->name, ")");
  return Settle(child_, ncclInProgress, what.c_str());
}

absl::Status NcclComms::Settle(ncclComm_t comm, int result, const char* what) {
  ncclResult_t r = static_cast<ncclResult_t>(result);
  const absl::Time deadline = absl::Now() + timeout_;
  while (r == ncclInProgress && comm != nullptr) {
    if (absl::Now() > deadline) {
      broken_ = absl::UnavailableError(
          absl::StrCat("nccl: ", what, " did not finish within ", absl::FormatDuration(timeout_)));
      return broken_;
    }
    if (interrupt_ != nullptr && interrupt_->load()) {
      broken_ = absl::UnavailableError(
          absl::StrCat("nccl: ", what, " was interrupted (the instance is being torn down)"));
      return broken_;
    }
    std::this_thread::yield();
    ncclResult_t async = ncclSuccess;
    const ncclResult_t q = ncclCommGetAsyncError(comm, &async);
    r = q != ncclSuccess ? q : async;
  }
  if (r == ncclSuccess) return absl::OkStatus();
  broken_ = NcclError(r, what);
  return broken_;
}

absl::Status NcclComms::Group(absl::FunctionRef<void()> post, const char* what) {
  ncclGroupStart();
  post();
  return Settle(world_, ncclGroupEnd(), what);
}

NcclComms::~NcclComms() {
  for (ncclComm_t comm : {child_, world_}) {
    if (comm == nullptr) continue;
    bool finished = false;
    if (broken_.ok()) finished = Settle(comm, ncclCommFinalize(comm), "ncclCommFinalize").ok();
    if (finished) {
      ncclCommDestroy(comm);
    } else {
      ncclCommAbort(comm);
    }
  }
}

void NcclComms::Abort() {
  // ncclCommAbort raises the communicator's abort flag, which NCCL's kernels
  // poll while they wait for a peer: they exit, and the stream moves on.
  for (ncclComm_t* comm : {&child_, &world_}) {
    if (*comm == nullptr) continue;
    ncclCommAbort(*comm);
    *comm = nullptr;
  }
  if (broken_.ok()) broken_ = absl::UnavailableError("nccl: the communicators were aborted");
}

absl::Status NcclComms::Health() {
  FLOTILLA_RETURN_IF_ERROR(broken_);
  for (ncclComm_t comm : {world_, child_}) {
    if (comm == nullptr) continue;
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(comm, &async);
    if (async != ncclSuccess && async != ncclInProgress) {
      broken_ = NcclError(async, "asynchronous error");
      return broken_;
    }
  }
  return absl::OkStatus();
}

}  // namespace flotilla::comm
