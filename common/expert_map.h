// The versioned expert map: for each layer and logical expert, the (rank, slot)
// pairs that hold it. A hot expert may have several replicas. Workers route
// tokens with it; the balancer replaces it at a step boundary.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace flotilla {

struct ExpertLocation {
  int rank = 0;
  int slot = 0;  // index into that rank's expert slots for the layer
  bool operator==(const ExpertLocation&) const = default;
};

class ExpertMap {
 public:
  ExpertMap() = default;

  // Experts in contiguous blocks over the ranks (rank r holds experts
  // [r*E/W, (r+1)*E/W), the remainder spread over the first ranks), the same
  // for every layer, no replicas.
  static absl::StatusOr<ExpertMap> Contiguous(int num_layers, int num_experts, int world_size,
                                              uint64_t version = 1);

  // Builds a map from explicit locations and validates it: every expert has at
  // least one replica, ranks are in range, and no (rank, slot) is used twice in
  // a layer.
  static absl::StatusOr<ExpertMap> Create(
      uint64_t version, int world_size,
      std::vector<std::vector<std::vector<ExpertLocation>>> locations);

  uint64_t version() const { return version_; }
  int num_layers() const { return static_cast<int>(locations_.size()); }
  int num_experts() const { return locations_.empty() ? 0 : static_cast<int>(locations_[0].size()); }
  int world_size() const { return world_size_; }

  const std::vector<ExpertLocation>& replicas(int layer, int expert) const {
    return locations_[layer][expert];
  }
  // Logical experts rank `rank` holds in `layer`, ordered by slot.
  std::vector<int> ExpertsOnRank(int layer, int rank) const;
  // Number of expert slots rank `rank` uses in `layer` (max slot + 1).
  int SlotsOnRank(int layer, int rank) const;

  const std::vector<std::vector<std::vector<ExpertLocation>>>& locations() const {
    return locations_;
  }

 private:
  uint64_t version_ = 0;
  int world_size_ = 0;
  std::vector<std::vector<std::vector<ExpertLocation>>> locations_;  // [layer][expert][replica]
};

}  // namespace flotilla
