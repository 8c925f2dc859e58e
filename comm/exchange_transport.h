// The device-transport interface: how a device parallel context's exchange
// reaches its peers. The context fills an EpLaunch (shape, this rank's
// buffers and state) and a transport completes it with the peers and
// enqueues the work on the caller's stream. Backends, one folder each:
// cuda_ipc/ (ranks of one node) and nccl/ (GPUs of any nodes). Beside the
// host Communicator (communicator.h), which creating a transport uses to
// trade handles or the NCCL unique id. Needs CUDA.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "kernels/cuda/ep_exchange.h"

namespace flotilla::comm {

class ExchangeTransport {
 public:
  virtual ~ExchangeTransport() = default;
  // "cuda-ipc" or "nccl" (the context's backend() in logs and the Hello).
  virtual std::string name() const = 0;

  // Moves each (token, choice) row of x to its expert's rank and leaves the
  // received rows in launch.self / launch.state (kernels/cuda/ep_exchange.h).
  virtual absl::Status Dispatch(kernels::cuda::EpLaunch launch, const uint16_t* x,
                                const int32_t* topk_ids, const float* topk_w, int tokens,
                                const int32_t* expert_first, const int32_t* expert_reps,
                                cudaStream_t stream) = 0;
  // Moves the expert outputs back to their sources and sums them into y,
  // joined over the TP group.
  virtual absl::Status Combine(kernels::cuda::EpLaunch launch, float* y, int tokens,
                               cudaStream_t stream) = 0;
  // Over the TP group of launch.shape (size > 1). With `residual`, adds the
  // sum into it and leaves `data` zero (kernels::cuda::LaunchEpAllReduce).
  virtual absl::Status AllReduce(kernels::cuda::EpLaunch launch, float* data, int64_t count,
                                 cudaStream_t stream, float* residual) = 0;
  // Whether a kernel may run the TP all-reduce itself as flagged lines
  // (kernels::cuda::LaunchLinearTpSum): then `launch` is completed with what
  // the kernel needs (the peers' buffers). Transports without device-side
  // lines say no and callers use AllReduce.
  virtual bool DeviceLines(kernels::cuda::EpLaunch* launch) const {
    (void)launch;
    return false;
  }
  // Failures the transport learns of outside the kernels' error word.
  virtual absl::Status Health() { return absl::OkStatus(); }
  // Makes this rank's exchanges already enqueued end without their peers (a
  // peer died or the instance is being torn down) and every later call fail.
  // Called on the thread that enqueues, never during a capture. Transports
  // whose kernels bound their own waits need not do anything.
  virtual void Abort() {}
};

}  // namespace flotilla::comm
