#include "coordinator/placement_transport.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace flotilla::coordinator {
namespace {

bool Offers(const WorkerDesc& w, const std::string& transport) {
  return w.device_transports.empty() ||
         std::find(w.device_transports.begin(), w.device_transports.end(), transport) !=
             w.device_transports.end();
}

// Why `transport` cannot link every rank; nullopt when it can.
std::optional<std::string> CannotJoin(const std::vector<const WorkerDesc*>& rank_workers,
                                      const std::string& transport) {
  for (size_t r = 0; r < rank_workers.size(); ++r) {
    const WorkerDesc& w = *rank_workers[r];
    if (!Offers(w, transport)) {
      return absl::StrCat("rank ", r, " (worker '", w.worker_id, "') cannot use ", transport,
                          " (it offers: ", absl::StrJoin(w.device_transports, ", "), ")");
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

}  // namespace

absl::StatusOr<std::string> ChooseDeviceTransport(
    const std::vector<const WorkerDesc*>& rank_workers) {
  if (rank_workers.size() <= 1 || rank_workers.front()->kind != DeviceKind::kCuda) return "";
  std::set<std::string> nodes;
  for (const WorkerDesc* w : rank_workers) nodes.insert(w->node);
  std::vector<std::string> why;
  if (nodes.size() == 1) {
    std::optional<std::string> ipc = CannotJoin(rank_workers, kCudaIpcTransport);
    if (!ipc) return std::string(kCudaIpcTransport);
    why.push_back(*ipc);
  } else {
    why.push_back(absl::StrCat("the ranks span ", nodes.size(), " nodes (",
                               absl::StrJoin(nodes, ", "), "), which cuda-ipc cannot link"));
  }
  std::optional<std::string> nccl = CannotJoin(rank_workers, kNcclTransport);
  if (!nccl) nccl = SharedGpu(rank_workers);
  if (!nccl) return std::string(kNcclTransport);
  why.push_back(*nccl);
  return absl::FailedPreconditionError(absl::StrCat(
      "no device transport links every GPU rank: ", absl::StrJoin(why, "; "),
      ". Build every worker with CUDA and NCCL, keep the ranks on one node, or give each rank "
      "its own GPU"));
}

}  // namespace flotilla::coordinator
