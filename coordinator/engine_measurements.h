// The engine measurements (admin MeasureEngine) a worker has been asked for
// and not yet answered. Not thread-safe: ClusterManager holds it under its
// mutex and calls the callbacks it hands back after unlocking.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/cluster.pb.h"

namespace flotilla::coordinator {

// Gets the measurement or why there is none, exactly once.
using MeasureCallback = std::function<void(absl::StatusOr<cluster::EngineMeasurement>)>;

// A callback and the result to call it with.
struct MeasureResult {
  MeasureCallback callback;
  absl::StatusOr<cluster::EngineMeasurement> result;
  void Deliver() { callback(std::move(result)); }
};

class EngineMeasurements {
 public:
  // Registers a measurement asked of `worker_id`; returns its id.
  uint64_t Add(std::string worker_id, absl::Time deadline, MeasureCallback callback);
  // The worker answered: the callback with the measurement, or with the
  // error it reports. Nothing when the id is unknown (expired meanwhile).
  std::vector<MeasureResult> Answer(const std::string& worker_id,
                                    const cluster::EngineMeasurement& measurement);
  // The worker is gone: every measurement asked of it fails with `status`.
  std::vector<MeasureResult> FailWorker(const std::string& worker_id, const absl::Status& status);
  // Measurements past their deadline fail with DEADLINE_EXCEEDED.
  std::vector<MeasureResult> Expire(absl::Time now);
  size_t size() const { return pending_.size(); }

 private:
  struct Pending {
    std::string worker_id;
    absl::Time deadline;
    MeasureCallback callback;
  };
  std::map<uint64_t, Pending> pending_;
  uint64_t next_id_ = 1;
};

}  // namespace flotilla::coordinator
