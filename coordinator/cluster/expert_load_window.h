// ExpertLoadWindow: the coordinator's sliding window of expert load. Ranks
// report the rows their experts ran per (layer, logical expert), tagged with
// the expert-map version they ran under; the window keeps the samples of the
// last `max_age` (a rank's reports within a second merged into one sample,
// stamped with the first) and sums any shorter span of them, per rank, for
// one map version (so a window read after a switch measures only the new
// map).
// Thread-safe; time is passed in.
#pragma once

#include <cstdint>
#include <deque>
#include <mutex>
#include <vector>

#include "absl/time/time.h"
#include "proto/cluster.pb.h"

namespace flotilla::coordinator {

struct ExpertLoadCounts {
  int num_layers = 0;
  int num_experts = 0;
  // [rank][layer * num_experts + expert]: rows that rank's experts ran.
  std::vector<std::vector<uint64_t>> by_rank;
  absl::Duration span;  // from the oldest sample used to `now`
  int samples = 0;
  uint64_t total() const;
  // Rows per logical expert of `layer`, summed over the ranks.
  std::vector<uint64_t> ExpertTotals(int layer) const;
  // Rows each rank ran in `layer`.
  std::vector<uint64_t> RankTotals(int layer) const;
};

class ExpertLoadWindow {
 public:
  explicit ExpertLoadWindow(absl::Duration max_age) : max_age_(max_age) {}

  // Forgets everything and fixes the shape (a new placement).
  void Reset(int world_size, int num_layers, int num_experts);
  // A rank's report received at `at`; reports of another shape are ignored.
  void Add(int rank, absl::Time at, const cluster::ExpertLoad& load);
  // The samples of map `version` received in (now - window, now].
  ExpertLoadCounts Sum(absl::Time now, absl::Duration window, uint64_t version) const;

 private:
  struct Sample {
    absl::Time at;
    int rank = 0;
    uint64_t version = 0;
    std::vector<uint64_t> tokens;
  };
  const absl::Duration max_age_;
  mutable std::mutex mu_;
  int world_size_ = 0, num_layers_ = 0, num_experts_ = 0;
  std::deque<Sample> samples_;  // oldest first
};

// max / mean of `loads` (1 when all are equal, 0 when all are 0).
double Imbalance(const std::vector<double>& loads);

}  // namespace flotilla::coordinator
