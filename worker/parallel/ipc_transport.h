// cuda-ipc: every rank maps every peer's receive buffers (CUDA IPC handles
// traded over the host communicator; also between processes sharing one
// GPU) and the kernels write rows, outputs and all-reduce parts straight
// into them, raising sequence flags the receivers poll with a bound.
#pragma once

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "comm/communicator.h"
#include "worker/parallel/exchange_buffers.h"
#include "worker/parallel/exchange_transport.h"

namespace flotilla::parallel {

class IpcTransport final : public ExchangeTransport {
 public:
  // Exports `buffers`' receive allocation, maps every peer's (`host` spans
  // the context's ranks). `buffers` must outlive the transport.
  static absl::StatusOr<std::unique_ptr<IpcTransport>> Create(comm::Communicator& host,
                                                              const ExchangeBuffers& buffers);
  ~IpcTransport() override;

  std::string name() const override { return "cuda-ipc"; }
  absl::Status Dispatch(kernels::cuda::EpLaunch launch, const uint16_t* x, const int32_t* topk_ids,
                        const float* topk_w, int tokens, const int32_t* expert_first,
                        const int32_t* expert_reps, cudaStream_t stream) override;
  absl::Status Combine(kernels::cuda::EpLaunch launch, float* y, int tokens,
                       cudaStream_t stream) override;
  absl::Status AllReduce(kernels::cuda::EpLaunch launch, float* data, int64_t count,
                         cudaStream_t stream) override;

 private:
  IpcTransport() = default;
  kernels::cuda::EpLaunch WithPeers(kernels::cuda::EpLaunch launch) const;

  std::vector<void*> mapped_;  // peers' receive allocations (null for this rank)
  kernels::cuda::EpRecvBuffers* peers_ = nullptr;  // device array, one per rank
};

}  // namespace flotilla::parallel
