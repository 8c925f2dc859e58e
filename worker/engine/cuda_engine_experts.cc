// CudaEngine's expert hot swap on a sharded rank: the rows each expert slot
// ran (read back without a host wait), and experts uploaded into the slots
// a new expert map uses (staged on a copy stream while steps go on).
#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "kernels/cuda/moe.h"
#include "worker/engine/cuda_engine.h"
#include "worker/engine/cuda_engine_state.h"
#include "worker/parallel/parallel_context.h"

namespace flotilla {
namespace {

namespace kc = kernels::cuda;

// [layer][slot] -> the expert `map` puts in that slot of `rank` (-1: none).
std::vector<std::vector<int>> SlotExperts(const ExpertMap& map, int rank, int max_slots) {
  std::vector<std::vector<int>> out(map.num_layers(), std::vector<int>(max_slots, -1));
  for (int l = 0; l < map.num_layers(); ++l) {
    for (int e = 0; e < map.num_experts(); ++e) {
      for (const ExpertLocation& at : map.replicas(l, e)) {
        if (at.rank == rank && at.slot < max_slots) out[l][at.slot] = e;
      }
    }
  }
  return out;
}

}  // namespace

std::vector<uint64_t> CudaEngine::TakeExpertCounts() {
  CudaDeviceState& d = *impl_;
  if (d.expert_counts == nullptr) return {};
  cudaSetDevice(d.device);
  const int L = config_.num_hidden_layers, E = config_.num_local_experts;
  std::vector<uint64_t> out;
  if (d.counts_pending) {
    if (cudaEventQuery(d.counts_event) == cudaErrorNotReady) return {};
    out.assign(static_cast<size_t>(L) * E, 0);
    for (int l = 0; l < L; ++l) {
      for (int slot = 0; slot < d.max_slots; ++slot) {
        const int e = d.counts_slot_expert[l][slot];
        if (e >= 0) out[l * E + e] += d.expert_counts_host[l * d.max_slots + slot];
      }
    }
    d.counts_pending = false;
  }
  // The next read-back: after this step's kernels, on the same stream.
  const size_t bytes = static_cast<size_t>(L) * d.max_slots * sizeof(uint32_t);
  if (cudaMemcpyAsync(d.expert_counts_host, d.expert_counts, bytes, cudaMemcpyDeviceToHost,
                      d.stream) == cudaSuccess &&
      cudaMemsetAsync(d.expert_counts, 0, bytes, d.stream) == cudaSuccess &&
      cudaEventRecord(d.counts_event, d.stream) == cudaSuccess) {
    d.counts_slot_expert =
        SlotExperts(options_.parallel->expert_map(), options_.parallel->rank(), d.max_slots);
    d.counts_pending = true;
  }
  return out;
}

absl::Status CudaEngine::UploadExperts(const ExpertMap& current, const ExpertMap& next,
                                       const ModelWeights& extra, cudaStream_t stream) {
  CudaDeviceState& d = *impl_;
  if (options_.parallel == nullptr) {
    return absl::FailedPreconditionError("a single-GPU engine holds every expert already");
  }
  if (options_.parallel->config().moe_tp()) {
    return absl::FailedPreconditionError(
        "the tensor-parallel MoE layout holds a slice of every expert: nothing to move");
  }
  const int rank = options_.parallel->rank();
  if (next.num_layers() != config_.num_hidden_layers ||
      current.num_layers() != config_.num_hidden_layers ||
      static_cast<int>(extra.layers.size()) != config_.num_hidden_layers) {
    return absl::InvalidArgumentError("expert upload: the maps or the experts miss layers");
  }
  const auto now = SlotExperts(current, rank, d.max_slots);
  cudaSetDevice(d.device);
  for (int l = 0; l < next.num_layers(); ++l) {
    for (int e = 0; e < next.num_experts(); ++e) {
      for (const ExpertLocation& at : next.replicas(l, e)) {
        if (at.rank != rank) continue;
        if (at.slot >= d.max_slots) {
          return absl::InvalidArgumentError(absl::StrCat(
              "layer ", l, " slot ", at.slot, ": this rank has ", d.max_slots, " expert slots"));
        }
        if (now[l][at.slot] == e) continue;
        if (now[l][at.slot] >= 0) {
          return absl::FailedPreconditionError(
              absl::StrCat("layer ", l, " slot ", at.slot, " holds expert ", now[l][at.slot],
                           " in the current map; it cannot take expert ", e, " before the switch"));
        }
        const ExpertWeights* x = nullptr;
        for (const ExpertWeights& w : extra.layers[l].experts) {
          if (w.expert_id == e) x = &w;
        }
        if (x == nullptr) {
          return absl::InvalidArgumentError(
              absl::StrCat("expert upload: no weights for layer ", l, " expert ", e));
        }
        FLOTILLA_CUDA_RETURN(kc::UploadMoeExpert(
            d.layers[l].moe, at.slot, x->gate_up.blocks, x->gate_up.scales, x->gate_up_bias.data,
            x->down.blocks, x->down.scales, x->down_bias.data, stream));
      }
    }
  }
  FLOTILLA_CUDA_RETURN(cudaStreamSynchronize(stream));
  return absl::OkStatus();
}

absl::Status CudaEngine::StageExperts(const ExpertMap& current, const ExpertMap& next,
                                      const ModelWeights& extra) {
  CudaDeviceState& d = *impl_;
  cudaSetDevice(d.device);
  if (d.copy_stream == nullptr) {
    FLOTILLA_CUDA_RETURN(cudaStreamCreateWithFlags(&d.copy_stream, cudaStreamNonBlocking));
  }
  FLOTILLA_RETURN_IF_ERROR(UploadExperts(current, next, extra, d.copy_stream));
  d.staged_version = next.version();
  return absl::OkStatus();
}

absl::Status CudaEngine::InstallExperts(const ExpertMap& next, ModelWeights extra) {
  // Staged on the loader thread already (the normal path); otherwise copied
  // here, between steps.
  if (impl_->staged_version == next.version()) return absl::OkStatus();
  return UploadExperts(options_.parallel->expert_map(), next, extra, impl_->stream);
}

}  // namespace flotilla
