// cuda-ipc: every rank maps every peer's receive buffers (CUDA IPC handles
// traded over the host communicator; also between processes sharing one
// GPU) and the kernels write rows, outputs and all-reduce parts straight
// into them, raising sequence flags the receivers poll with a bound.
#pragma once

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "comm/communicator.h"
#include "comm/exchange_transport.h"

namespace flotilla::comm {

class CudaIpcTransport final : public ExchangeTransport {
 public:
  // Exports this rank's receive allocation (`recv_base`, which `recv` views)
  // and maps every peer's (`host` spans the context's ranks). Every rank's
  // allocation has the same layout, so a peer's view is `recv` moved to the
  // peer's mapping. The allocation must outlive the transport.
  static absl::StatusOr<std::unique_ptr<CudaIpcTransport>> Create(
      Communicator& host, void* recv_base, const kernels::cuda::EpRecvBuffers& recv);
  ~CudaIpcTransport() override;

  std::string name() const override { return "cuda-ipc"; }
  absl::Status Dispatch(kernels::cuda::EpLaunch launch, const uint16_t* x, const int32_t* topk_ids,
                        const float* topk_w, int tokens, const int32_t* expert_first,
                        const int32_t* expert_reps, cudaStream_t stream) override;
  absl::Status Combine(kernels::cuda::EpLaunch launch, float* y, int tokens,
                       cudaStream_t stream) override;
  absl::Status AllReduce(kernels::cuda::EpLaunch launch, float* data, int64_t count,
                         cudaStream_t stream, float* residual) override;
  bool DeviceLines(kernels::cuda::EpLaunch* launch) const override;

 private:
  CudaIpcTransport() = default;
  kernels::cuda::EpLaunch WithPeers(kernels::cuda::EpLaunch launch) const;

  std::vector<void*> mapped_;  // peers' receive allocations (null for this rank)
  kernels::cuda::EpRecvBuffers* peers_ = nullptr;  // device array, one per rank
};

}  // namespace flotilla::comm
