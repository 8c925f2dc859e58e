// Which transport carries device buffers (TP all-reduce, EP dispatch and
// combine) between the GPU ranks of one instance. The host communicator (UCX)
// stays beside it for control and bootstrap.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/cluster/worker_desc.h"
#include "proto/cluster.pb.h"

namespace flotilla::coordinator {

// CUDA IPC when every rank is on one node, else NCCL (one node falls back to
// NCCL when a worker cannot do CUDA IPC); `requested` (the coordinator's
// --device-transport; UNSPECIFIED = automatic) pins the choice. UNSPECIFIED
// for CPU ranks and for a single rank, which has no peer. Refuses, saying
// which rank and why, when a worker does not offer the transport the layout
// needs, when CUDA IPC is asked for across nodes, or when NCCL would have to
// put two ranks on one GPU (it allows one rank per GPU). `rank_workers[r]`
// holds rank r; workers that report no transports are taken to offer both.
absl::StatusOr<cluster::DeviceTransport> ChooseDeviceTransport(
    const std::vector<const WorkerDesc*>& rank_workers, cluster::DeviceTransport requested);

}  // namespace flotilla::coordinator
