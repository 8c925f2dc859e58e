// Clock: where time comes from, so code that reasons about time (liveness,
// deadlines, waits) can run in tests on simulated time. RealClock is the
// process's clock; SimulatedClock moves only when a test advances it.
#pragma once

#include <mutex>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace flotilla {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time TimeNow() = 0;
  // The process's real clock (never destroyed).
  static Clock* Real();
};

class RealClock final : public Clock {
 public:
  absl::Time TimeNow() override { return absl::Now(); }
};

inline Clock* Clock::Real() {
  static RealClock* clock = new RealClock();
  return clock;
}

class SimulatedClock final : public Clock {
 public:
  explicit SimulatedClock(absl::Time start = absl::UnixEpoch()) : now_(start) {}
  absl::Time TimeNow() override {
    std::lock_guard<std::mutex> lock(mu_);
    return now_;
  }
  void Advance(absl::Duration d) {
    std::lock_guard<std::mutex> lock(mu_);
    now_ += d;
  }

 private:
  std::mutex mu_;
  absl::Time now_;
};

}  // namespace flotilla
