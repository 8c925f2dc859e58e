#include "coordinator/engine_measurements.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace flotilla::coordinator {

uint64_t EngineMeasurements::Add(std::string worker_id, absl::Time deadline,
                                 MeasureCallback callback) {
  const uint64_t id = next_id_++;
  pending_[id] = Pending{std::move(worker_id), deadline, std::move(callback)};
  return id;
}

std::vector<MeasureResult> EngineMeasurements::Answer(
    const std::string& worker_id, const cluster::EngineMeasurement& measurement) {
  auto it = pending_.find(measurement.measure_id());
  // Only the worker asked may answer.
  if (it == pending_.end() || it->second.worker_id != worker_id) return {};
  absl::StatusOr<cluster::EngineMeasurement> result = measurement;
  if (measurement.error_code() != 0) {
    result = absl::Status(static_cast<absl::StatusCode>(measurement.error_code()),
                          absl::StrCat("worker '", worker_id, "': ", measurement.error()));
  }
  std::vector<MeasureResult> out;
  out.push_back(MeasureResult{std::move(it->second.callback), std::move(result)});
  pending_.erase(it);
  return out;
}

std::vector<MeasureResult> EngineMeasurements::FailWorker(const std::string& worker_id,
                                                          const absl::Status& status) {
  std::vector<MeasureResult> out;
  for (auto it = pending_.begin(); it != pending_.end();) {
    if (it->second.worker_id != worker_id) {
      ++it;
      continue;
    }
    out.push_back(MeasureResult{std::move(it->second.callback), status});
    it = pending_.erase(it);
  }
  return out;
}

std::vector<MeasureResult> EngineMeasurements::Expire(absl::Time now) {
  std::vector<MeasureResult> out;
  for (auto it = pending_.begin(); it != pending_.end();) {
    if (it->second.deadline > now) {
      ++it;
      continue;
    }
    out.push_back(MeasureResult{
        std::move(it->second.callback),
        absl::DeadlineExceededError(absl::StrCat(
            "worker '", it->second.worker_id, "' did not finish the engine measurement in time"))});
    it = pending_.erase(it);
  }
  return out;
}

}  // namespace flotilla::coordinator
