#include "comm/nccl/nccl_communicator.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace flotilla::comm {
namespace {

absl::Status FromNccl(ncclResult_t r, absl::string_view what) {
  const std::string msg = absl::StrCat(what, ": ", ncclGetErrorString(r));
  switch (r) {
    case ncclSuccess:
      return absl::OkStatus();
    case ncclInvalidArgument:
    case ncclInvalidUsage:
      return absl::InvalidArgumentError(msg);
    case ncclRemoteError:
    case ncclSystemError:
      return absl::UnavailableError(msg);
    default:
      return absl::InternalError(msg);
  }
}

absl::Status FromCuda(cudaError_t e, absl::string_view what) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(what, ": ", cudaGetErrorString(e)));
}

// Polls a non-blocking communicator until its pending call leaves
// ncclInProgress; false on timeout.
bool AwaitNotInProgress(ncclComm_t comm, absl::Time deadline, ncclResult_t* result) {
  for (;;) {
    ncclResult_t r = ncclSuccess;
    ncclResult_t q = ncclCommGetAsyncError(comm, &r);
    if (q != ncclSuccess) {
      *result = q;
      return true;
    }
    if (r != ncclInProgress) {
      *result = r;
      return true;
    }
    if (absl::Now() > deadline) return false;
    std::this_thread::yield();
  }
}

ncclDataType_t ToNccl(DataType t) {
  return t == DataType::kF32 ? ncclFloat32 : ncclBfloat16;
}

}  // namespace

absl::StatusOr<std::string> NcclUniqueId() {
  ncclUniqueId id;
  FLOTILLA_RETURN_IF_ERROR(FromNccl(ncclGetUniqueId(&id), "ncclGetUniqueId"));
  return std::string(id.internal, sizeof(id.internal));
}

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Create(
    int rank, int size, const std::string& unique_id, const NcclOptions& options) {
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat("NcclCommunicator: rank ", rank, " is outside a group of ", size));
  }
  if (unique_id.size() != NCCL_UNIQUE_ID_BYTES) {
    return absl::InvalidArgumentError(absl::StrCat("NcclCommunicator: the unique id has ",
                                                   unique_id.size(), " bytes, not ",
                                                   NCCL_UNIQUE_ID_BYTES));
  }
  if (options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("NcclCommunicator: timeout must be positive");
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess) {
    cudaGetLastError();
    devices = 0;
  }
  if (options.device < 0 || options.device >= devices) {
    return absl::FailedPreconditionError(absl::StrCat(
        "NcclCommunicator: CUDA device ", options.device, " does not exist (", devices, " found)"));
  }
  std::unique_ptr<NcclCommunicator> c(new NcclCommunicator(rank, size, options));
  FLOTILLA_RETURN_IF_ERROR(FromCuda(cudaSetDevice(options.device), "cudaSetDevice"));
  cudaStream_t s = nullptr;
  FLOTILLA_RETURN_IF_ERROR(
      FromCuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate"));
  c->stream_ = s;
  FLOTILLA_RETURN_IF_ERROR(FromCuda(
      cudaMalloc(reinterpret_cast<void**>(&c->device_counts_), 2 * sizeof(size_t) * static_cast<size_t>(size)),
      "cudaMalloc"));
  FLOTILLA_RETURN_IF_ERROR(
      FromCuda(cudaMalloc(reinterpret_cast<void**>(&c->device_token_), sizeof(float)), "cudaMalloc"));

  ncclUniqueId id;
  std::memcpy(id.internal, unique_id.data(), NCCL_UNIQUE_ID_BYTES);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // lets every wait below have a deadline
  ncclResult_t r = ncclCommInitRankConfig(&c->comm_, size, id, rank, &config);
  if (r != ncclSuccess && r != ncclInProgress) {
    return FromNccl(r, "ncclCommInitRankConfig");
  }
  if (!AwaitNotInProgress(c->comm_, absl::Now() + options.timeout, &r)) {
    return c->Fail(absl::UnavailableError(absl::StrCat(
        "NcclCommunicator: rank ", rank, " of ", size, ": the group did not form within ",
        absl::FormatDuration(options.timeout))));
  }
  if (r != ncclSuccess) return c->Fail(FromNccl(r, "ncclCommInitRankConfig"));
  return c;
}

NcclCommunicator::~NcclCommunicator() {
  cudaSetDevice(options_.device);
  if (comm_ != nullptr) {
    bool finished = false;
    const ncclResult_t f = broken_.ok() ? ncclCommFinalize(comm_) : ncclInvalidUsage;
    if (f == ncclSuccess || f == ncclInProgress) {
      ncclResult_t r;
      finished = AwaitNotInProgress(comm_, absl::Now() + options_.timeout, &r) && r == ncclSuccess;
    }
    if (finished) {
      ncclCommDestroy(comm_);
    } else {
      ncclCommAbort(comm_);
    }
  }
  if (device_counts_ != nullptr) cudaFree(device_counts_);
  if (device_token_ != nullptr) cudaFree(device_token_);
  if (stream_ != nullptr) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
}

absl::Status NcclCommunicator::Fail(absl::Status status) {
  if (comm_ != nullptr) {
    ncclCommAbort(comm_);
    comm_ = nullptr;
  }
  broken_ = status;
  return status;
}

absl::Status NcclCommunicator::Begin() {
  if (!broken_.ok()) {
    return absl::UnavailableError(absl::StrCat(
        "communicator is broken after an earlier failure: ", broken_.message()));
  }
  return FromCuda(cudaSetDevice(options_.device), "cudaSetDevice");
}

absl::Status NcclCommunicator::Enqueued(int result, const char* what) {
  ncclResult_t r = static_cast<ncclResult_t>(result);
  if (r == ncclInProgress &&
      !AwaitNotInProgress(comm_, absl::Now() + options_.timeout, &r)) {
    return Fail(absl::UnavailableError(absl::StrCat(what, ": not enqueued within ",
                                                    absl::FormatDuration(options_.timeout))));
  }
  if (r == ncclSuccess) return absl::OkStatus();
  absl::Status st = FromNccl(r, what);
  if (absl::IsUnavailable(st) || absl::IsInternal(st)) return Fail(st);
  return st;
}

absl::Status NcclCommunicator::Finish(void* stream) {
  return stream == nullptr ? Wait(nullptr) : absl::OkStatus();
}

absl::Status NcclCommunicator::Wait(void* stream) {
  if (!broken_.ok()) {
    return absl::UnavailableError(absl::StrCat(
        "communicator is broken after an earlier failure: ", broken_.message()));
  }
  cudaStream_t s = static_cast<cudaStream_t>(StreamOr(stream));
  const auto start = std::chrono::steady_clock::now();
  const absl::Time deadline = absl::Now() + options_.timeout;
  for (uint64_t iter = 0;; ++iter) {
    cudaError_t e = cudaStreamQuery(s);
    if (e == cudaSuccess) return absl::OkStatus();
    if (e != cudaErrorNotReady) return Fail(FromCuda(e, "stream"));
    if ((iter & 63) != 0) continue;
    ncclResult_t r = ncclSuccess;
    ncclCommGetAsyncError(comm_, &r);
    if (r != ncclSuccess && r != ncclInProgress) return Fail(absl::UnavailableError(
        absl::StrCat("rank ", rank_, ": NCCL reported ", ncclGetErrorString(r))));
    if (absl::Now() > deadline) {
      return Fail(absl::UnavailableError(absl::StrCat(
          "rank ", rank_, ": NCCL operation did not complete within ",
          absl::FormatDuration(options_.timeout), " (a peer died or stalled)")));
    }
    if (std::chrono::steady_clock::now() - start > std::chrono::microseconds(200)) {
      std::this_thread::yield();
    }
  }
}

absl::Status NcclCommunicator::AllReduce(void* buffer, size_t count, DataType type,
                                         void* stream) {
  if (DataTypeSize(type) == 0) return absl::InvalidArgumentError("AllReduce: unknown data type");
  FLOTILLA_RETURN_IF_ERROR(Begin());
  if (count == 0) return absl::OkStatus();
  FLOTILLA_RETURN_IF_ERROR(Enqueued(ncclAllReduce(buffer, buffer, count, ToNccl(type), ncclSum,
                                                  comm_, static_cast<cudaStream_t>(StreamOr(stream))),
                                    "ncclAllReduce"));
  return Finish(stream);
}

absl::Status NcclCommunicator::AllGather(const void* send, void* recv, size_t bytes_per_rank,
                                         void* stream) {
  FLOTILLA_RETURN_IF_ERROR(Begin());
  if (bytes_per_rank == 0) return absl::OkStatus();
  FLOTILLA_RETURN_IF_ERROR(Enqueued(ncclAllGather(send, recv, bytes_per_rank, ncclUint8, comm_,
                                                  static_cast<cudaStream_t>(StreamOr(stream))),
                                    "ncclAllGather"));
  return Finish(stream);
}

absl::Status NcclCommunicator::Broadcast(void* buffer, size_t bytes, int root, void* stream) {
  if (root < 0 || root >= size_) {
    return absl::InvalidArgumentError(
        absl::StrCat("Broadcast: root ", root, " is not a rank of a group of ", size_));
  }
  FLOTILLA_RETURN_IF_ERROR(Begin());
  if (bytes == 0) return absl::OkStatus();
  FLOTILLA_RETURN_IF_ERROR(Enqueued(ncclBroadcast(buffer, buffer, bytes, ncclUint8, root, comm_,
                                                  static_cast<cudaStream_t>(StreamOr(stream))),
                                    "ncclBroadcast"));
  return Finish(stream);
}

absl::Status NcclCommunicator::AllToAllV(const void* send, absl::Span<const size_t> send_counts,
                                         absl::Span<const size_t> send_offsets, void* recv,
                                         absl::Span<const size_t> recv_counts,
                                         absl::Span<const size_t> recv_offsets, void* stream) {
  FLOTILLA_RETURN_IF_ERROR(
      ValidateAllToAllV(size_, send_counts, send_offsets, recv_counts, recv_offsets));
  const size_t me = static_cast<size_t>(rank_);
  if (send_counts[me] != recv_counts[me]) {
    return absl::InvalidArgumentError(absl::StrCat("AllToAllV: rank ", rank_, " sends itself ",
                                                   send_counts[me],
                                                   " bytes but expects to receive ",
                                                   recv_counts[me]));
  }
  FLOTILLA_RETURN_IF_ERROR(Begin());
  cudaStream_t s = static_cast<cudaStream_t>(StreamOr(stream));
  const auto* in = static_cast<const uint8_t*>(send);
  auto* out = static_cast<uint8_t*>(recv);
  // Zero counts post nothing: NCCL matches sends and receives one to one.
  ncclResult_t r = ncclGroupStart();
  for (int p = 0; p < size_ && r == ncclSuccess; ++p) {
    const size_t q = static_cast<size_t>(p);
    if (send_counts[q] > 0) r = ncclSend(in + send_offsets[q], send_counts[q], ncclUint8, p, comm_, s);
    if (r == ncclSuccess && recv_counts[q] > 0) {
      r = ncclRecv(out + recv_offsets[q], recv_counts[q], ncclUint8, p, comm_, s);
    }
  }
  ncclResult_t end = ncclGroupEnd();
  FLOTILLA_RETURN_IF_ERROR(Enqueued(r != ncclSuccess ? r : end, "AllToAllV (ncclSend/ncclRecv)"));
  return Finish(stream);
}

absl::Status NcclCommunicator::ExchangeCounts(absl::Span<const size_t> send_counts,
                                              absl::Span<size_t> recv_counts) {
  const size_t n = static_cast<size_t>(size_);
  if (send_counts.size() != n || recv_counts.size() != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("ExchangeCounts: expected ", n, " counts per side"));
  }
  FLOTILLA_RETURN_IF_ERROR(Begin());
  cudaStream_t s = static_cast<cudaStream_t>(stream_);
  FLOTILLA_RETURN_IF_ERROR(FromCuda(cudaMemcpyAsync(device_counts_, send_counts.data(),
                                                    n * sizeof(size_t), cudaMemcpyHostToDevice, s),
                                    "cudaMemcpyAsync"));
  std::vector<size_t> each(n, sizeof(size_t));
  std::vector<size_t> offsets = PackedOffsets(each);
  FLOTILLA_RETURN_IF_ERROR(AllToAllV(device_counts_, each, offsets, device_counts_ + n, each,
                                     offsets, stream_));
  FLOTILLA_RETURN_IF_ERROR(FromCuda(cudaMemcpyAsync(recv_counts.data(), device_counts_ + n,
                                                    n * sizeof(size_t), cudaMemcpyDeviceToHost, s),
                                    "cudaMemcpyAsync"));
  return Wait(nullptr);
}

absl::Status NcclCommunicator::Barrier(void* stream) {
  FLOTILLA_RETURN_IF_ERROR(Begin());
  FLOTILLA_RETURN_IF_ERROR(Enqueued(ncclAllReduce(device_token_, device_token_, 1, ncclFloat32,
                                                  ncclSum, comm_,
                                                  static_cast<cudaStream_t>(StreamOr(stream))),
                                    "Barrier (ncclAllReduce)"));
  return Finish(stream);
}

}  // namespace flotilla::comm
