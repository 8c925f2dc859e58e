#include "worker/parallel/device_expert_table.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/status.h"
#include "kernels/cuda/ep_exchange.h"

namespace flotilla::parallel {
namespace {

int64_t MostReplicasInALayer(const ExpertMap& map) {
  int64_t most = 0;
  for (int l = 0; l < map.num_layers(); ++l) {
    int64_t n = 0;
    for (int e = 0; e < map.num_experts(); ++e)
      n += static_cast<int64_t>(map.replicas(l, e).size());
    most = std::max(most, n);
  }
  return most;
}

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceExpertTable>> DeviceExpertTable::Create(const ExpertMap& map) {
  if (map.num_layers() < 1 || map.num_experts() < 1) {
    return absl::InvalidArgumentError("device expert table: the map has no layers or experts");
  }
  // Room for every expert on every rank: a rebalanced map may add replicas
  // without reallocating (which would invalidate captured graphs).
  const int64_t per_layer = std::max(MostReplicasInALayer(map),
                                     static_cast<int64_t>(map.num_experts()) * map.world_size());
  std::unique_ptr<DeviceExpertTable> t(
      new DeviceExpertTable(map.num_layers(), map.num_experts(), per_layer));
  FLOTILLA_CUDA_RETURN_IF_ERROR(cudaMalloc(
      &t->first_, sizeof(int32_t) * static_cast<size_t>(t->layers_) * (t->experts_ + 1)));
  FLOTILLA_CUDA_RETURN_IF_ERROR(
      cudaMalloc(&t->reps_, sizeof(int32_t) * static_cast<size_t>(t->layers_ * per_layer)));
  FLOTILLA_RETURN_IF_ERROR(t->Upload(map));
  return t;
}

DeviceExpertTable::~DeviceExpertTable() {
  if (first_ != nullptr) cudaFree(first_);
  if (reps_ != nullptr) cudaFree(reps_);
}

absl::Status DeviceExpertTable::Upload(const ExpertMap& map) {
  if (map.num_layers() != layers_ || map.num_experts() != experts_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "device expert table: a map of ", map.num_layers(), " layers x ", map.num_experts(),
        " experts cannot replace one of ", layers_, " x ", experts_));
  }
  std::vector<int32_t> first(static_cast<size_t>(layers_) * (experts_ + 1));
  std::vector<int32_t> reps(static_cast<size_t>(layers_ * reps_per_layer_), 0);
  for (int l = 0; l < layers_; ++l) {
    int32_t* f = first.data() + static_cast<size_t>(l) * (experts_ + 1);
    int32_t* r = reps.data() + static_cast<size_t>(l) * reps_per_layer_;
    int64_t n = 0;
    for (int e = 0; e < experts_; ++e) {
      f[e] = static_cast<int32_t>(n);
      for (const ExpertLocation& loc : map.replicas(l, e)) {
        if (n == reps_per_layer_) {
          return absl::ResourceExhaustedError(absl::StrCat(
              "device expert table: layer ", l, " has more than ", reps_per_layer_, " replicas"));
        }
        if (loc.slot > 0xffff || loc.rank > 0x7fff) {
          return absl::InvalidArgumentError(absl::StrCat("device expert table: rank ", loc.rank,
                                                         " slot ", loc.slot, " does not pack"));
        }
        r[n++] = kernels::cuda::EpPackLocation(loc.rank, loc.slot);
      }
    }
    f[experts_] = static_cast<int32_t>(n);
  }
  FLOTILLA_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  FLOTILLA_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(first_, first.data(), first.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
  FLOTILLA_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(reps_, reps.data(), reps.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
  // A copy from pageable memory may return before it landed, and kernels on
  // non-blocking streams do not wait for it.
  return CudaStatus(cudaDeviceSynchronize(), "uploading the expert table");
}

}  // namespace flotilla::parallel
