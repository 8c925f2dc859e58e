// A ParallelContext on device memory (Memory::kDevice) for GPU ranks.
// Transports, chosen per instance at creation:
//   cuda-ipc: ranks of one node (also several processes on one GPU, which is
//     how a one-GPU machine tests it; run the MPS daemon for speed). Every
//     rank maps its peers' receive buffers (cudaIpcOpenMemHandle); kernels
//     write rows straight into them and raise per-peer sequence flags the
//     receiver polls with a bounded spin (a timeout is recorded on the device
//     and reported by CheckHealth()).
//   nccl: ranks on distinct GPUs of any number of nodes; fixed-capacity
//     ncclSend/ncclRecv per peer (counts travel inside the buffers).
// Needs CUDA; declared here without CUDA types.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "comm/communicator.h"
#include "worker/parallel/parallel_context.h"

namespace flotilla::parallel {

enum class DeviceTransport { kAuto, kCudaIpc, kNccl };

struct DeviceContextOptions {
  int device = 0;  // CUDA device of this rank
  DeviceTransport transport = DeviceTransport::kAuto;  // kAuto: cuda-ipc when all ranks share a node
  int hidden = 0;
  int top_k = 0;
  int64_t max_tokens_per_step = 0;
  absl::Duration timeout = absl::Seconds(30);  // bound of every device wait
};

// `host` spans the same ranks as the instance (rank() == rank) and is used
// only while creating the context: to learn which ranks share a node and to
// exchange IPC handles or the NCCL unique id. It need not outlive the call.
absl::StatusOr<std::unique_ptr<ParallelContext>> CreateDeviceContext(
    const ParallelConfig& config, ExpertMap map, int rank, comm::Communicator& host,
    const DeviceContextOptions& options);

}  // namespace flotilla::parallel
