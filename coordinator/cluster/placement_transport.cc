#include "coordinator/cluster/placement_transport.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/comm_names.h"

namespace flotilla::coordinator {
namespace {

using cluster::DeviceTransport;

bool Offers(const WorkerDesc& w, DeviceTransport transport) {
  return w.device_transports.empty() ||
         std::find(w.device_transports.begin(), w.device_transports.end(), transport) !=
             w.device_transports.end();
}

std::string OfferedNames(const WorkerDesc& w) {
  std::vector<std::string> names;
  for (DeviceTransport t : w.device_transports) names.push_back(DeviceTransportName(t));
  return absl::StrJoin(names, ", ");
}

// Why `transport` cannot link every rank; nullopt when it can.
std::optional<std::string> CannotJoin(const std::vector<const WorkerDesc*>& rank_workers,
                                      DeviceTransport transport) {
  for (size_t r = 0; r < rank_workers.size(); ++r) {
    const WorkerDesc& w = *rank_workers[r];
    if (!Offers(w, transport)) {
      return absl::StrCat("rank ", r, " (worker '", w.worker_id, "') cannot use ",
                          DeviceTransportName(transport), " (it offers: ", OfferedNames(w), ")");
    }
  }
  return std::nullopt;
}

// NCCL refuses two ranks of one communicator on one GPU.
std::optional<std::string> SharedGpu(const std::vector<const WorkerDesc*>& rank_workers) {
  std::map<std::string, size_t> first_on_gpu;
  for (size_t r = 0; r < rank_workers.size(); ++r) {
    auto [it, fresh] = first_on_gpu.emplace(GpuKey(*rank_workers[r]), r);
    if (!fresh) {
      return absl::StrCat("ranks ", it->second, " and ", r, " share ",
                          DescribeGpu(*rank_workers[r]), ", and nccl allows one rank per GPU");
    }
  }
  return std::nullopt;
}

// Why CUDA IPC cannot link the ranks; nullopt when it can.
std::optional<std::string> CannotUseIpc(const std::vector<const WorkerDesc*>& rank_workers) {
  std::set<std::string> nodes;
  for (const WorkerDesc* w : rank_workers) nodes.insert(w->node);
  if (nodes.size() > 1) {
    return absl::StrCat("the ranks span ", nodes.size(), " nodes (", absl::StrJoin(nodes, ", "),
                        "), which cuda-ipc cannot link");
  }
  return CannotJoin(rank_workers, cluster::DEVICE_TRANSPORT_CUDA_IPC);
}

std::optional<std::string> CannotUseNccl(const std::vector<const WorkerDesc*>& rank_workers) {
  std::optional<std::string> why = CannotJoin(rank_workers, cluster::DEVICE_TRANSPORT_NCCL);
  return why ? why : SharedGpu(rank_workers);
}

}  // namespace

absl::StatusOr<DeviceTransport> ChooseDeviceTransport(
    const std::vector<const WorkerDesc*>& rank_workers, DeviceTransport requested) {
  if (rank_workers.size() <= 1 || rank_workers.front()->kind != DeviceKind::kCuda) {
    return cluster::DEVICE_TRANSPORT_UNSPECIFIED;
  }
  if (requested == cluster::DEVICE_TRANSPORT_CUDA_IPC ||
      requested == cluster::DEVICE_TRANSPORT_NCCL) {
    const std::optional<std::string> why = requested == cluster::DEVICE_TRANSPORT_NCCL
                                               ? CannotUseNccl(rank_workers)
                                               : CannotUseIpc(rank_workers);
    if (!why) return requested;
    return absl::FailedPreconditionError(absl::StrCat(
        "device transport ", DeviceTransportName(requested), " cannot link the GPU ranks: ", *why,
        ". Use --device-transport auto, or change the workers"));
  }
  std::vector<std::string> why;
  std::optional<std::string> ipc = CannotUseIpc(rank_workers);
  if (!ipc) return cluster::DEVICE_TRANSPORT_CUDA_IPC;
  why.push_back(*ipc);
  std::optional<std::string> nccl = CannotUseNccl(rank_workers);
  if (!nccl) return cluster::DEVICE_TRANSPORT_NCCL;
  why.push_back(*nccl);
  return absl::FailedPreconditionError(absl::StrCat(
      "no device transport links every GPU rank: ", absl::StrJoin(why, "; "),
      ". Build every worker with CUDA and NCCL, keep the ranks on one node, or give each rank "
      "its own GPU"));
}

}  // namespace flotilla::coordinator
