// What a worker tells the coordinator about where it runs, in its Hello: the
// machine's identity, its GPU (total and free memory, UUID) and the device
// transports it could join. Placement decides from these which ranks share a
// node and a GPU, and whether the shards fit.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "proto/cluster.pb.h"
#include "proto/common.pb.h"

namespace flotilla::worker {

// The same for every process of one machine and different between machines:
// the kernel's boot id (the host name when it cannot be read). Containers on
// one machine share it, as they share its GPUs.
std::string HostId();

// --device cuda: whether GPU `ordinal` exists among the visible ones (and the
// build has CUDA), so that a worker without its GPU stops at once with the
// reason instead of registering as something it is not.
absl::Status CheckCudaDevice(int ordinal);

// Fills `device` with GPU `ordinal`: kind, index, name, compute capability,
// total and free memory, UUID. Leaves it untouched when there is no such GPU.
void DescribeCudaDevice(int ordinal, common::DeviceInfo* device);

// Device-memory transports a worker on `device` can join: none on the CPU; on
// a GPU CUDA IPC and, when built with NCCL, NCCL.
std::vector<cluster::DeviceTransport> DeviceTransports(const common::DeviceInfo& device);

}  // namespace flotilla::worker
