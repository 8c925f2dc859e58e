#include "worker/parallel/nccl_transport.h"

#include <nccl.h>

#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/parallel/cuda_status.h"

namespace flotilla::parallel {
namespace {

namespace kc = kernels::cuda;

absl::Status NcclError(ncclResult_t r, absl::string_view what) {
  return absl::UnavailableError(absl::StrCat("nccl: ", what, ": ", ncclGetErrorString(r)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<NcclTransport>> NcclTransport::Create(
    comm::Communicator& host, const ParallelConfig& config, const ExchangeSizes& sizes,
    absl::Duration timeout, std::shared_ptr<const std::atomic<bool>> interrupt) {
  std::unique_ptr<NcclTransport> t(new NcclTransport(sizes, timeout, std::move(interrupt)));
  const size_t rows = static_cast<size_t>(sizes.rows_max());
  const size_t x_bytes = (rows * sizes.hidden * sizeof(uint16_t) + 255) / 256 * 256;
  const size_t meta_bytes = static_cast<size_t>(sizes.world) * (sizes.cap_max() + 1) * 4;
  FLOTILLA_CUDA_RETURN_IF_ERROR(cudaMalloc(&t->staging_, x_bytes + meta_bytes));
  t->staging_view_.x = static_cast<uint16_t*>(t->staging_);
  t->staging_view_.meta = reinterpret_cast<int32_t*>(static_cast<char*>(t->staging_) + x_bytes);
  std::vector<kc::EpRecvBuffers> pack_to(static_cast<size_t>(sizes.world), t->staging_view_);
  FLOTILLA_CUDA_RETURN_IF_ERROR(cudaMalloc(&t->pack_to_, sizeof(kc::EpRecvBuffers) * sizes.world));
  FLOTILLA_CUDA_RETURN_IF_ERROR(cudaMemcpy(t->pack_to_, pack_to.data(),
                                           sizeof(kc::EpRecvBuffers) * sizes.world,
                                           cudaMemcpyHostToDevice));
  FLOTILLA_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());  // the copy may still be in flight
  FLOTILLA_RETURN_IF_ERROR(t->Form(host, config));
  return t;
}

absl::Status NcclTransport::Form(comm::Communicator& host, const ParallelConfig& config) {
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
  if (config.tp_size() == 1) return absl::OkStatus();
  const int rank = host.rank();
  const ncclResult_t split =
      ncclCommSplit(world_, config.dp_group_of(rank), config.tp_rank_of(rank), &tp_, &cfg);
  if (split != ncclSuccess && split != ncclInProgress)
    return Settle(world_, split, "ncclCommSplit");
  // On a non-blocking parent, ncclCommSplit returns ncclSuccess while the
  // child is still being built on NCCL's group thread: the parent reads
  // ncclInProgress until then, and `tp_` is stored just before the parent
  // settles. So wait on the parent whatever the split returned; trusting its
  // return left `tp_` null on distinct GPUs, where building takes longer.
  FLOTILLA_RETURN_IF_ERROR(Settle(world_, ncclInProgress, "ncclCommSplit"));
  if (tp_ == nullptr) {
    broken_ = absl::UnavailableError("nccl: ncclCommSplit gave no tensor-parallel communicator");
    return broken_;
  }
  return Settle(tp_, ncclInProgress, "ncclCommSplit (tensor-parallel communicator)");
}

absl::Status NcclTransport::Settle(ncclComm_t comm, int result, const char* what) {
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

NcclTransport::~NcclTransport() {
  for (ncclComm_t comm : {tp_, world_}) {
    if (comm == nullptr) continue;
    bool finished = false;
    if (broken_.ok()) finished = Settle(comm, ncclCommFinalize(comm), "ncclCommFinalize").ok();
    if (finished) {
      ncclCommDestroy(comm);
    } else {
      ncclCommAbort(comm);
    }
  }
  if (pack_to_ != nullptr) cudaFree(pack_to_);
  if (staging_ != nullptr) cudaFree(staging_);
}

void NcclTransport::Abort() {
  // ncclCommAbort raises the communicator's abort flag, which NCCL's kernels
  // poll while they wait for a peer: they exit, and the stream moves on.
  for (ncclComm_t* comm : {&tp_, &world_}) {
    if (*comm == nullptr) continue;
    ncclCommAbort(*comm);
    *comm = nullptr;
  }
  if (broken_.ok()) broken_ = absl::UnavailableError("nccl: the communicators were aborted");
}

absl::Status NcclTransport::Dispatch(kc::EpLaunch launch, const uint16_t* x,
                                     const int32_t* topk_ids, const float* topk_w, int tokens,
                                     const int32_t* expert_first, const int32_t* expert_reps,
                                     cudaStream_t stream) {
  FLOTILLA_RETURN_IF_ERROR(broken_);
  launch.ipc = false;
  launch.peers = pack_to_;
  FLOTILLA_RETURN_IF_ERROR(CudaStatus(
      kc::LaunchEpDispatch(launch, x, topk_ids, topk_w, tokens, expert_first, expert_reps, stream),
      "dispatch pack"));
  const size_t cap = static_cast<size_t>(launch.shape.cap);
  const size_t row_bytes = static_cast<size_t>(launch.shape.hidden) * sizeof(uint16_t);
  char* send_x = reinterpret_cast<char*>(staging_view_.x);
  char* recv_x = reinterpret_cast<char*>(launch.self.x);
  ncclGroupStart();
  for (int p = 0; p < launch.shape.world; ++p) {
    if (cap > 0) {
      ncclSend(send_x + p * cap * row_bytes, cap * row_bytes, ncclUint8, p, world_, stream);
      ncclRecv(recv_x + p * cap * row_bytes, cap * row_bytes, ncclUint8, p, world_, stream);
    }
    ncclSend(staging_view_.meta + p * (cap + 1), cap + 1, ncclInt32, p, world_, stream);
    ncclRecv(launch.self.meta + p * (cap + 1), cap + 1, ncclInt32, p, world_, stream);
  }
  FLOTILLA_RETURN_IF_ERROR(Settle(world_, ncclGroupEnd(), "dispatch"));
  return CudaStatus(kc::LaunchEpUnpack(launch, stream), "dispatch unpack");
}

absl::Status NcclTransport::Combine(kc::EpLaunch launch, float* y, int tokens,
                                    cudaStream_t stream) {
  FLOTILLA_RETURN_IF_ERROR(broken_);
  launch.ipc = false;
  launch.peers = pack_to_;
  const size_t rows = static_cast<size_t>(launch.shape.cap);
  const size_t floats = rows * static_cast<size_t>(launch.shape.hidden);
  if (floats > 0) {
    ncclGroupStart();
    for (int p = 0; p < launch.shape.world; ++p) {
      ncclSend(launch.state.out + p * floats, floats, ncclFloat32, p, world_, stream);
      ncclRecv(launch.self.combined + p * floats, floats, ncclFloat32, p, world_, stream);
    }
    FLOTILLA_RETURN_IF_ERROR(Settle(world_, ncclGroupEnd(), "combine"));
  }
  FLOTILLA_RETURN_IF_ERROR(
      CudaStatus(kc::LaunchEpCombine(launch, y, tokens, stream), "combine reduce"));
  if (tp_ == nullptr || tokens == 0) return absl::OkStatus();
  return Settle(tp_,
                ncclAllReduce(y, y, static_cast<size_t>(tokens) * launch.shape.hidden, ncclFloat32,
                              ncclSum, tp_, stream),
                "combine join");
}

absl::Status NcclTransport::AllReduce(kc::EpLaunch launch, float* data, int64_t count,
                                      cudaStream_t stream) {
  FLOTILLA_RETURN_IF_ERROR(broken_);
  if (tp_ == nullptr || count == 0) return absl::OkStatus();
  return Settle(
      tp_, ncclAllReduce(data, data, static_cast<size_t>(count), ncclFloat32, ncclSum, tp_, stream),
      "all-reduce");
}

absl::Status NcclTransport::Health() {
  FLOTILLA_RETURN_IF_ERROR(broken_);
  for (ncclComm_t comm : {world_, tp_}) {
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

}  // namespace flotilla::parallel
