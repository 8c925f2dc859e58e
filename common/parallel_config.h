// The parallel layout of one model instance: W ranks form DP groups of TP
// ranks for attention; experts are spread over all W ranks (EP = W).
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "common/model_config.h"

namespace flotilla {

class ParallelConfig {
 public:
  // Rejects impossible layouts with a message that says why: tp must divide the
  // world size and both head counts of `model`; the world may not exceed the
  // number of experts (every rank holds at least one).
  static absl::StatusOr<ParallelConfig> Create(int world_size, int tp_size,
                                               const ModelConfig& model);

  int world_size() const { return world_size_; }
  int tp_size() const { return tp_size_; }
  int dp_size() const { return world_size_ / tp_size_; }
  int ep_size() const { return world_size_; }

  // Ranks [g * tp, (g + 1) * tp) form DP group g; rank g * tp is its leader.
  int dp_group_of(int rank) const { return rank / tp_size_; }
  int tp_rank_of(int rank) const { return rank % tp_size_; }
  int leader_of_group(int group) const { return group * tp_size_; }
  bool is_leader(int rank) const { return tp_rank_of(rank) == 0; }

  std::string ToString() const;

 private:
  ParallelConfig(int world, int tp) : world_size_(world), tp_size_(tp) {}
  int world_size_;
  int tp_size_;
};

}  // namespace flotilla
