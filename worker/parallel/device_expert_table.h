// The expert map of every layer as the dispatch kernels read it: per layer,
// first[E + 1] (each expert's replicas start in reps) and reps (packed
// (rank, slot) locations, kernels::cuda::EpPackLocation). Rewritten in place
// on a map change, so graphs captured with its pointers stay valid.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "common/expert_map.h"

namespace flotilla::parallel {

class DeviceExpertTable {
 public:
  static absl::StatusOr<std::unique_ptr<DeviceExpertTable>> Create(const ExpertMap& map);
  ~DeviceExpertTable();
  DeviceExpertTable(const DeviceExpertTable&) = delete;
  DeviceExpertTable& operator=(const DeviceExpertTable&) = delete;

  // Replaces the contents with `map`, which must have the same layers and
  // experts and fit the replica capacity reserved at creation. Waits for the
  // whole device first: kernels of the previous step may still read the table.
  absl::Status Upload(const ExpertMap& map);

  const int32_t* first(int layer) const {
    return first_ + static_cast<int64_t>(layer) * (experts_ + 1);
  }
  const int32_t* reps(int layer) const {
    return reps_ + static_cast<int64_t>(layer) * reps_per_layer_;
  }

 private:
  DeviceExpertTable(int layers, int experts, int64_t reps_per_layer)
      : layers_(layers), experts_(experts), reps_per_layer_(reps_per_layer) {}

  int layers_;
  int experts_;
  int64_t reps_per_layer_;
  int32_t* first_ = nullptr;
  int32_t* reps_ = nullptr;
};

}  // namespace flotilla::parallel
