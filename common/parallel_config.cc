#include "common/parallel_config.h"

#include "absl/strings/str_cat.h"

namespace flotilla {

absl::StatusOr<ParallelConfig> ParallelConfig::Create(int world_size, int tp_size,
                                                      const ModelConfig& model) {
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
  if (world_size > model.num_local_experts) {
    return absl::InvalidArgumentError(
        absl::StrCat(world_size, " workers but the model has only ", model.num_local_experts,
                     " experts: expert parallelism needs at least one expert per rank"));
  }
  return ParallelConfig(world_size, tp_size);
}

std::string ParallelConfig::ToString() const {
  return absl::StrCat("world=", world_size_, " tp=", tp_size_, " dp=", dp_size(),
                      " ep=", ep_size());
}

}  // namespace flotilla
