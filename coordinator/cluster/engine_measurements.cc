#include "coordinator/cluster/engine_measurements.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace flotilla::coordinator {

uint64_t EngineMeasurements::Add(std::vector<std::string> workers, std::string leader,
                                 absl::Time deadline, MeasureCallback callback) {
  const uint64_t id = next_id_++;
  Pending p;
  p.waiting = std::set<std::string>(workers.begin(), workers.end());
  p.workers = std::move(workers);
  p.leader = std::move(leader);
  p.deadline = deadline;
  p.callback = std::move(callback);
  pending_[id] = std::move(p);
  return id;
}

std::vector<MeasureResult> EngineMeasurements::Answer(
    const std::string& worker_id, const cluster::EngineMeasurement& measurement) {
  auto it = pending_.find(measurement.measure_id());
  // Only a worker asked may answer, once.
  if (it == pending_.end() || it->second.waiting.erase(worker_id) == 0) return {};
  Pending& p = it->second;
  absl::StatusOr<cluster::EngineMeasurement> result;
  if (measurement.error_code() != 0) {
    result = absl::Status(static_cast<absl::StatusCode>(measurement.error_code()),
                          absl::StrCat("worker '", worker_id, "': ", measurement.error()));
  } else {
    if (worker_id == p.leader) p.leaders = measurement;
    if (!p.waiting.empty()) return {};
    result = *p.leaders;  // the leader was asked, so it is among those that answered
  }
  std::vector<MeasureResult> out;
  out.push_back(MeasureResult{std::move(p.callback), std::move(result)});
  pending_.erase(it);
  return out;
}

std::vector<MeasureResult> EngineMeasurements::FailWorker(const std::string& worker_id,
                                                          const absl::Status& status) {
  std::vector<MeasureResult> out;
  for (auto it = pending_.begin(); it != pending_.end();) {
    const std::vector<std::string>& workers = it->second.workers;
    if (std::find(workers.begin(), workers.end(), worker_id) == workers.end()) {
      ++it;
      continue;
    }
    out.push_back(MeasureResult{std::move(it->second.callback), status});
    it = pending_.erase(it);
  }
  return out;
}

std::vector<MeasureResult> EngineMeasurements::FailAll(const absl::Status& status) {
  std::vector<MeasureResult> out;
  for (auto& [id, p] : pending_) out.push_back(MeasureResult{std::move(p.callback), status});
  pending_.clear();
  return out;
}

std::vector<MeasureResult> EngineMeasurements::Expire(absl::Time now) {
  std::vector<MeasureResult> out;
  for (auto it = pending_.begin(); it != pending_.end();) {
    if (it->second.deadline > now) {
      ++it;
      continue;
    }
    const std::set<std::string>& waiting = it->second.waiting;
    out.push_back(MeasureResult{
        std::move(it->second.callback),
        absl::DeadlineExceededError(absl::StrCat(
            "the engine measurement did not finish in time; no answer from worker",
            waiting.size() == 1 ? " '" : "s '", absl::StrJoin(waiting, "', '"), "'"))});
    it = pending_.erase(it);
  }
  return out;
}

}  // namespace flotilla::coordinator
