// The engine measurements (admin MeasureEngine) the ranks of an instance have
// been asked for and not all answered. Every rank runs the probe (a sharded
// instance steps in lockstep); the call gets the leader's measurement once
// every rank has answered, or the first error. Not thread-safe: ClusterManager
// holds it under its mutex and calls the callbacks it hands back after unlocking.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
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
  // Registers a measurement asked of every worker in `workers` (the
  // instance's ranks), answered with `leader`'s measurement; returns its id.
  uint64_t Add(std::vector<std::string> workers, std::string leader, absl::Time deadline,
               MeasureCallback callback);
  // A worker answered. An error ends the call with it at once; otherwise
  // the call ends with the leader's measurement when the last worker
  // answers. Nothing when the id is unknown (expired meanwhile) or the
  // worker was not asked or has answered already.
  std::vector<MeasureResult> Answer(const std::string& worker_id,
                                    const cluster::EngineMeasurement& measurement);
  // The worker is gone: every measurement it takes part in fails with
  // `status` (its peers cannot finish the probe without it).
  std::vector<MeasureResult> FailWorker(const std::string& worker_id, const absl::Status& status);
  // Every measurement fails with `status` (the instance is formed again).
  std::vector<MeasureResult> FailAll(const absl::Status& status);
  // Measurements past their deadline fail with DEADLINE_EXCEEDED.
  std::vector<MeasureResult> Expire(absl::Time now);
  size_t size() const { return pending_.size(); }

 private:
  struct Pending {
    std::vector<std::string> workers;  // every worker asked
    std::set<std::string> waiting;     // those that have not answered
    std::string leader;
    std::optional<cluster::EngineMeasurement> leaders;  // once it answered
    absl::Time deadline;
    MeasureCallback callback;
  };
  std::map<uint64_t, Pending> pending_;
  uint64_t next_id_ = 1;
};

}  // namespace flotilla::coordinator
