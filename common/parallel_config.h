// The parallel layout of one model instance: W ranks form DP groups of TP
// ranks for attention. The MoE layer is split one of two ways:
//   expert parallel (EP = W): each rank holds whole experts, tokens travel to
//     them (dispatch) and back (combine);
//   tensor parallel: each rank of a TP group holds a slice of every expert's
//     intermediate dimension, runs its group's tokens through its slices and
//     the group sums the partial outputs (one all-reduce, no dispatch); every
//     DP group holds every expert, so nothing crosses groups (EP = 1).
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "common/model_config.h"

namespace flotilla {

enum class MoeLayout { kExpertParallel, kTensorParallel };

// "ep" / "tp".
const char* MoeLayoutName(MoeLayout layout);

// The columns [begin, begin + size) of the intermediate dimension one TP rank
// of the tensor-parallel MoE layout holds: whole 32-value MXFP4 blocks, the
// first (blocks % tp) ranks one block more (2880 / 32 = 90 blocks over 4
// ranks: 23, 23, 22, 22).
struct IntermediateSlice {
  int begin = 0;
  int size = 0;
};
IntermediateSlice IntermediateSliceOf(int intermediate, int tp_rank, int tp_size);

class ParallelConfig {
 public:
  // Rejects impossible layouts with a message that says why: tp must divide the
  // world size and both head counts of `model`; with expert parallelism the
  // world may not exceed the number of experts (every rank holds at least
  // one); with the tensor-parallel MoE every rank needs one 32-value block of
  // the intermediate dimension.
  static absl::StatusOr<ParallelConfig> Create(int world_size, int tp_size,
                                               const ModelConfig& model,
                                               MoeLayout moe = MoeLayout::kExpertParallel);

  int world_size() const { return world_size_; }
  int tp_size() const { return tp_size_; }
  int dp_size() const { return world_size_ / tp_size_; }
  int ep_size() const { return moe_tp() ? 1 : world_size_; }
  MoeLayout moe_layout() const { return moe_; }
  bool moe_tp() const { return moe_ == MoeLayout::kTensorParallel && tp_size_ > 1; }

  // Ranks [g * tp, (g + 1) * tp) form DP group g; rank g * tp is its leader.
  int dp_group_of(int rank) const { return rank / tp_size_; }
  int tp_rank_of(int rank) const { return rank % tp_size_; }
  int leader_of_group(int group) const { return group * tp_size_; }
  bool is_leader(int rank) const { return tp_rank_of(rank) == 0; }

  std::string ToString() const;

 private:
  ParallelConfig(int world, int tp, MoeLayout moe) : world_size_(world), tp_size_(tp), moe_(moe) {}
  int world_size_;
  int tp_size_;
  MoeLayout moe_;
};

}  // namespace flotilla
