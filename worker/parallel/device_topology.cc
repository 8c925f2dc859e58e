#include "worker/parallel/device_topology.h"

#include <cuda_runtime_api.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/status.h"
#include "kernels/cuda/ep_exchange.h"

namespace flotilla::parallel {
namespace {

std::string NodeName() {
  char host[64] = {};
  gethostname(host, sizeof(host) - 1);
  std::string boot;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
  return absl::StrCat(host, "/", boot);
}

bool NcclBuilt() {
#if FLOTILLA_WITH_NCCL
  return true;
#else
  return false;
#endif
}

}  // namespace

absl::StatusOr<RankIdentity> LocalIdentity(int device, const std::vector<int64_t>& fingerprint) {
  RankIdentity id;
  const std::string node = NodeName();
  std::strncpy(id.node, node.c_str(), sizeof(id.node) - 1);
  FLOTILLA_CUDA_RETURN_IF_ERROR(
      cudaDeviceGetPCIBusId(id.pci_bus_id, sizeof(id.pci_bus_id), device));
  if (fingerprint.size() > std::size(id.fingerprint)) {
    return absl::InternalError("device context fingerprint too long");
  }
  for (size_t i = 0; i < fingerprint.size(); ++i) id.fingerprint[i] = fingerprint[i];
  id.resident_blocks = kernels::cuda::EpResidentBlocks(device);
  return id;
}

namespace {

// Ranks on the same GPU of the same OS instance.
bool SameGpu(const RankIdentity& a, const RankIdentity& b) {
  return std::strncmp(a.node, b.node, sizeof(a.node)) == 0 &&
         std::strncmp(a.pci_bus_id, b.pci_bus_id, sizeof(a.pci_bus_id)) == 0;
}

// How many ranks (r included) sit on r's GPU.
int64_t RanksOnGpuOf(const RankIdentity& r, const std::vector<RankIdentity>& ranks) {
  return std::count_if(ranks.begin(), ranks.end(),
                       [&](const RankIdentity& other) { return SameGpu(r, other); });
}

}  // namespace

int AgreedMaxBlocks(const std::vector<RankIdentity>& ranks) {
  int64_t agreed = kernels::cuda::kEpMaxBlocks;
  for (const RankIdentity& r : ranks) {
    agreed =
        std::min(agreed, r.resident_blocks / (2 * std::max<int64_t>(RanksOnGpuOf(r, ranks), 1)));
  }
  return static_cast<int>(std::max<int64_t>(agreed, 2));
}

bool EveryRankOwnsItsGpu(const std::vector<RankIdentity>& ranks) {
  return std::all_of(ranks.begin(), ranks.end(),
                     [&](const RankIdentity& r) { return RanksOnGpuOf(r, ranks) == 1; });
}

absl::StatusOr<std::vector<RankIdentity>> ExchangeIdentities(comm::Communicator& host,
                                                             const RankIdentity& mine) {
  std::vector<RankIdentity> all(static_cast<size_t>(host.size()));
  FLOTILLA_RETURN_IF_ERROR(host.AllGather(&mine, all.data(), sizeof(RankIdentity)));
  for (size_t r = 0; r < all.size(); ++r) {
    if (std::memcmp(all[r].fingerprint, mine.fingerprint, sizeof(mine.fingerprint)) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("device context: rank ", r,
                       " was created with another shape (world, tp, hidden, "
                       "top_k, max tokens, layers, experts) than rank ",
                       host.rank()));
    }
  }
  return all;
}

bool CanMapPeers(const std::vector<RankIdentity>& ranks, int device, std::string* why) {
  for (size_t r = 0; r < ranks.size(); ++r) {
    if (std::strncmp(ranks[r].node, ranks[0].node, sizeof(ranks[r].node)) != 0) {
      *why = absl::StrCat("rank ", r, " runs on another node");
      return false;
    }
    int peer_device = -1;
    if (cudaDeviceGetByPCIBusId(&peer_device, ranks[r].pci_bus_id) != cudaSuccess) {
      cudaGetLastError();
      *why = absl::StrCat("rank ", r, "'s GPU ", ranks[r].pci_bus_id, " is not visible here");
      return false;
    }
    int access = 0;
    if (peer_device != device &&
        (cudaDeviceCanAccessPeer(&access, device, peer_device) != cudaSuccess || access == 0)) {
      cudaGetLastError();
      *why =
          absl::StrCat("no peer access from GPU ", device, " to rank ", r, "'s GPU ", peer_device);
      return false;
    }
  }
  return true;
}

absl::StatusOr<bool> AllRanksAgree(comm::Communicator& host, bool value) {
  std::vector<uint8_t> all(static_cast<size_t>(host.size()));
  const uint8_t mine = value ? 1 : 0;
  FLOTILLA_RETURN_IF_ERROR(host.AllGather(&mine, all.data(), 1));
  for (uint8_t v : all) {
    if (v == 0) return false;
  }
  return true;
}

absl::StatusOr<DeviceTransport> ChooseTransport(comm::Communicator& host,
                                                const std::vector<RankIdentity>& ranks, int device,
                                                DeviceTransport asked) {
  std::string why_not_ipc;
  FLOTILLA_ASSIGN_OR_RETURN(const bool ipc,
                            AllRanksAgree(host, CanMapPeers(ranks, device, &why_not_ipc)));
  if (why_not_ipc.empty() && !ipc) why_not_ipc = "a peer cannot map this rank's GPU";
  std::set<std::string> gpus;
  for (const RankIdentity& r : ranks) gpus.insert(absl::StrCat(r.node, "|", r.pci_bus_id));
  const bool gpu_per_rank = gpus.size() == ranks.size();
  std::string why_not_nccl;
  if (!NcclBuilt()) why_not_nccl = "this build has no NCCL";
  if (!gpu_per_rank) why_not_nccl = "NCCL refuses two ranks on one GPU";

  if (asked == DeviceTransport::kCudaIpc || (asked == DeviceTransport::kAuto && ipc)) {
    if (ipc) return DeviceTransport::kCudaIpc;
    return absl::FailedPreconditionError(
        absl::StrCat("device context: cuda-ipc cannot connect the ranks: ", why_not_ipc));
  }
  if (why_not_nccl.empty()) return DeviceTransport::kNccl;
  return absl::FailedPreconditionError(absl::StrCat(
      "device context: nccl cannot connect the ranks: ", why_not_nccl,
      asked == DeviceTransport::kAuto ? absl::StrCat("; nor cuda-ipc: ", why_not_ipc) : ""));
}

}  // namespace flotilla::parallel
