// Which transport carries device buffers (TP all-reduce, EP dispatch and
// combine) between the GPU ranks of one instance. The host communicator (UCX)
// stays beside it for control and bootstrap.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/worker_desc.h"

namespace flotilla::coordinator {

// Kernels write into peers' CUDA-IPC-mapped buffers: the low-latency path
// between processes of one node, also between processes sharing one GPU.
inline constexpr char kCudaIpcTransport[] = "cuda-ipc";
// Any GPUs on any nodes, one rank per GPU.
inline constexpr char kNcclTransport[] = "nccl";

// "cuda-ipc" when every rank is on one node, else "nccl" (one node falls back
// to NCCL when a worker cannot do CUDA IPC). Empty for CPU ranks and for a
// single rank, which has no peer. Refuses, saying which rank and why, when a
// worker does not offer the transport the layout needs, or when NCCL would
// have to put two ranks on one GPU (it allows one rank per GPU).
// `rank_workers[r]` holds rank r; workers that report no transports are
// taken to offer both.
absl::StatusOr<std::string> ChooseDeviceTransport(
    const std::vector<const WorkerDesc*>& rank_workers);

}  // namespace flotilla::coordinator
