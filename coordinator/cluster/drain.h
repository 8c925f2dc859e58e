// The coordinator's graceful stop: no new requests, the ones in flight run to
// their end for up to a bound, then whatever is left ends with UNAVAILABLE.
#pragma once

#include <functional>
#include <string>

#include "absl/time/time.h"
#include "coordinator/cluster/cluster_manager.h"

namespace flotilla::coordinator {

struct DrainResult {
  int in_flight_at_start = 0;
  int cut = 0;               // requests ended by the stop, not by themselves
  bool timed_out = false;    // `timeout` passed with requests still running
  bool interrupted = false;  // `stop_now` said to stop at once
};

// Refuses new requests (ClusterManager::BeginDrain), waits until none is in
// flight, `timeout` passes or `stop_now()` turns true (polled every 10 ms),
// then fails the remaining ones with UNAVAILABLE naming why.
DrainResult Drain(ClusterManager& manager, absl::Duration timeout,
                  const std::function<bool()>& stop_now);

// One line for the log.
std::string DescribeDrain(const DrainResult& result);

}  // namespace flotilla::coordinator
