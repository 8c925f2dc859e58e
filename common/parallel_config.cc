#include "common/parallel_config.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace flotilla {

const char* MoeLayoutName(MoeLayout layout) {
  return layout == MoeLayout::kTensorParallel ? "tp" : "ep";
}

IntermediateSlice IntermediateSliceOf(int intermediate, int tp_rank, int tp_size) {
  const int blocks = intermediate / 32;
  const int base = blocks / tp_size, extra = blocks % tp_size;
  IntermediateSlice s;
  s.begin = 32 * (tp_rank * base + std::min(tp_rank, extra));
  s.size = 32 * (base + (tp_rank < extra ? 1 : 0));
  return s;
}

absl::StatusOr<ParallelConfig> ParallelConfig::Create(int world_size, int tp_size,
                                                      const ModelConfig& model, MoeLayout moe) {
  if (world_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("world size must be >= 1, got ", world_size));
  }
  if (tp_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("tp size must be >= 1, got ", tp_size));
  }
  if (world_size % tp_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat("tp size ", tp_size,
                                                   " does not divide the number of workers ",
                                                   world_size, " (each DP group needs tp ranks)"));
  }
  if (model.num_key_value_heads % tp_size != 0 || model.num_attention_heads % tp_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tp size ", tp_size, " must divide the model's ", model.num_key_value_heads,
        " kv heads and ", model.num_attention_heads, " attention heads"));
  }
  if (moe == MoeLayout::kTensorParallel) {
    if (model.intermediate_size / 32 < tp_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("the tensor-parallel MoE splits the intermediate size ",
                       model.intermediate_size, " in 32-value blocks: at most ",
                       model.intermediate_size / 32, " ranks per TP group, got ", tp_size));
    }
    return ParallelConfig(world_size, tp_size, moe);
  }
  if (world_size > model.num_local_experts) {
    return absl::InvalidArgumentError(
        absl::StrCat(world_size, " workers but the model has only ", model.num_local_experts,
                     " experts: expert parallelism needs at least one expert per rank"));
  }
  return ParallelConfig(world_size, tp_size, moe);
}

std::string ParallelConfig::ToString() const {
  return absl::StrCat("world=", world_size_, " tp=", tp_size_, " dp=", dp_size(), " ep=", ep_size(),
                      " moe=", MoeLayoutName(moe_));
}

}  // namespace flotilla
