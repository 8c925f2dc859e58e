#include "coordinator/cluster/drain.h"

#include <thread>

#include "absl/strings/str_cat.h"

namespace flotilla::coordinator {

DrainResult Drain(ClusterManager& manager, absl::Duration timeout,
                  const std::function<bool()>& stop_now) {
  manager.BeginDrain();
  DrainResult result;
  result.in_flight_at_start = manager.InflightRequests();
  const absl::Time deadline = absl::Now() + timeout;
  while (manager.InflightRequests() > 0) {
    if (stop_now && stop_now()) {
      result.interrupted = true;
      break;
    }
    if (absl::Now() >= deadline) {
      result.timed_out = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  result.cut = manager.InflightRequests();
  if (result.cut > 0) {
    manager.FailAll(result.interrupted
                        ? "the server was stopped at once (a second signal) before this "
                          "request finished"
                        : absl::StrCat("the server stopped: this request did not finish within "
                                       "the drain timeout of ",
                                       absl::FormatDuration(timeout)));
  }
  return result;
}

std::string DescribeDrain(const DrainResult& result) {
  std::string line = absl::StrCat("drained: ", result.in_flight_at_start - result.cut, " of ",
                                  result.in_flight_at_start, " requests in flight finished");
  if (result.timed_out) absl::StrAppend(&line, "; the drain timeout ended ", result.cut);
  if (result.interrupted) absl::StrAppend(&line, "; a second signal ended ", result.cut);
  return line;
}

}  // namespace flotilla::coordinator
