// GPU-memory communicator over NCCL: every buffer is device memory of the
// communicator's device, and every call takes an optional cudaStream_t.
//
// Bootstrap: one rank (or the coordinator) calls NcclUniqueId() and every rank
// passes the same bytes to Create(rank, size, bytes, options); Create returns
// once all ranks joined (or UNAVAILABLE after the timeout). One rank per GPU.
//
// Streams: with stream == nullptr the call runs on the communicator's own
// stream and returns when the operation completed. With a stream the call only
// enqueues and returns; Wait(stream) then waits with the same timeout. A peer
// that dies or stalls gives UNAVAILABLE: the communicator is aborted (NCCL's
// kernels are torn down) instead of hanging.
//
// Environment: NCCL reads its NCCL_* variables (keep NCCL_NVLS_ENABLE=0 where
// NVLink multicast must stay off).
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "comm/communicator.h"

// NCCL's handle, so that this header does not include NCCL or CUDA.
typedef struct ncclComm* ncclComm_t;

namespace flotilla::comm {

struct NcclOptions {
  // CUDA device this rank's buffers live on.
  int device = 0;
  // How long Create waits for the group and any call waits for completion.
  absl::Duration timeout = absl::Seconds(60);
};

// Fresh bootstrap bytes for a new group (an ncclUniqueId, 128 bytes).
absl::StatusOr<std::string> NcclUniqueId();

class NcclCommunicator final : public Communicator {
 public:
  static absl::StatusOr<std::unique_ptr<NcclCommunicator>> Create(int rank, int size,
                                                                  const std::string& unique_id,
                                                                  const NcclOptions& options = {});
  // Finalizes the NCCL communicator (aborts it when that does not finish in time).
  ~NcclCommunicator() override;

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
  // Host spans, staged through a small device buffer; synchronous.
  absl::Status ExchangeCounts(absl::Span<const size_t> send_counts,
                              absl::Span<size_t> recv_counts) override;
  absl::Status Barrier(void* stream = nullptr) override;

  // Waits until the work queued on `stream` (nullptr: the communicator's own
  // stream) has finished, or gives UNAVAILABLE after the timeout (aborting).
  absl::Status Wait(void* stream);

 private:
  NcclCommunicator(int rank, int size, const NcclOptions& options)
      : rank_(rank), size_(size), options_(options) {}
  // Checks the communicator is usable and makes its device current.
  absl::Status Begin();
  // Turns the result of an enqueue call into a Status, waiting out
  // ncclInProgress of the non-blocking communicator.
  absl::Status Enqueued(int result, const char* what);
  // Enqueue done: with no caller stream, wait for completion.
  absl::Status Finish(void* stream);
  absl::Status Fail(absl::Status status);
  void* StreamOr(void* stream) const { return stream != nullptr ? stream : stream_; }

  const int rank_;
  const int size_;
  NcclOptions options_;
  ncclComm_t comm_ = nullptr;
  void* stream_ = nullptr;         // cudaStream_t
  size_t* device_counts_ = nullptr;  // 2 * size entries, for ExchangeCounts
  float* device_token_ = nullptr;    // one float, for Barrier
  absl::Status broken_;
};

}  // namespace flotilla::comm
