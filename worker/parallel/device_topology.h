// Where the ranks of a device context run, learned over the host
// communicator while the context forms, and the transport that follows:
// cuda-ipc needs every rank on this node with a GPU this process can map
// (the same GPU, or one with peer access); NCCL needs a GPU per rank.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "comm/communicator.h"
#include "worker/parallel/device_context.h"

namespace flotilla::parallel {

// What a rank tells its peers (fixed size: it travels in one AllGather).
struct RankIdentity {
  char node[128] = {};          // hostname and boot id: processes of one OS instance
  char pci_bus_id[32] = {};     // the rank's GPU
  int64_t fingerprint[8] = {};  // the context's shape; must match on every rank
  int64_t resident_blocks = 0;  // exchange kernel blocks the GPU holds at once
};

// This process's identity for a context on `device` whose shape is `fingerprint`.
absl::StatusOr<RankIdentity> LocalIdentity(int device, const std::vector<int64_t>& fingerprint);

// Every rank's identity, indexed by rank; INVALID_ARGUMENT when the ranks
// disagree on the context's shape.
absl::StatusOr<std::vector<RankIdentity>> ExchangeIdentities(comm::Communicator& host,
                                                             const RankIdentity& mine);

// Whether this process can map every peer's buffers through CUDA IPC.
bool CanMapPeers(const std::vector<RankIdentity>& ranks, int device, std::string* why);

// The grid cap of the exchange kernels, the same on every rank: the blocks
// of all ranks sharing a GPU must be resident together (each waits for all
// of the others), so each rank's share is half of what its GPU holds over
// the ranks on that GPU, and the smallest share over the ranks wins.
int AgreedMaxBlocks(const std::vector<RankIdentity>& ranks);

// True when no two ranks share a GPU. Kernels whose many blocks wait for
// peers' blocks (the TP sum inside a projection, TensorParallel::DeviceLines)
// run only then: with ranks sharing a GPU, one rank's waiting blocks could
// hold the slots its peers' blocks need.
bool EveryRankOwnsItsGpu(const std::vector<RankIdentity>& ranks);

// True when `value` is true on every rank (one AllGather).
absl::StatusOr<bool> AllRanksAgree(comm::Communicator& host, bool value);

// The transport every rank will use (all ranks reach the same answer), or
// FAILED_PRECONDITION saying why the one asked for cannot work.
absl::StatusOr<DeviceTransport> ChooseTransport(comm::Communicator& host,
                                                const std::vector<RankIdentity>& ranks, int device,
                                                DeviceTransport asked);

}  // namespace flotilla::parallel
