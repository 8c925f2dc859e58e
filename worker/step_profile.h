// Where a serving step's wall time goes on one worker, for operators chasing
// the gap between the served inter-token latency and the engine's own step
// (`--step-profile-steps N`, FLOTILLA_STEP_PROFILE_STEPS). The engine loop
// marks the end of each phase of a step; every N steps that did work, one
// JSON log line gives each phase's median and 99th percentile in
// microseconds, and the step's whole wall time:
//   between: from the end of the last step to this one (coordinator
//            messages, load reports, expert-store polls)
//   plan:    the scheduler's plan (leaders)
//   exchange: the plan exchange with the other ranks (all-gather, the
//            group's plan), 0 on a single worker
//   send:    the updates the plan produced, to the coordinator
//   engine:  the engine's step (host preparation, the device, the tokens back)
//   complete: the scheduler's bookkeeping and the tokens to the coordinator
// and, from engines that measure them (Engine::LastStepTiming), two parts of
// `engine`: engine_launch (until the device work was launched) and
// engine_wait (the host waiting for the device).
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace flotilla::worker {

class StepProfile {
 public:
  enum Phase {
    kBetween,
    kPlan,
    kExchange,
    kSend,
    kEngine,
    kComplete,
    kEngineLaunch,  // parts of kEngine, from AddEngineTiming
    kEngineWait,
    kNumPhases
  };

  // every: steps per summary (0: off, every call a no-op).
  explicit StepProfile(int64_t every) : every_(every) {}

  bool on() const { return every_ > 0; }
  // The current phase (kBetween .. kComplete) ends now.
  void Mark(Phase phase);
  // The engine's own split of its step (Engine::LastStepTiming).
  void AddEngineTiming(double launch_us, double wait_us);
  // The step ends; `worked` says whether it ran anything (idle steps are not
  // counted). Returns the summary line when one is due, else "".
  std::string EndStep(bool worked);

  static const char* Name(Phase phase);

 private:
  using Clock = std::chrono::steady_clock;
  int64_t every_;
  Clock::time_point last_{};
  Clock::time_point step_start_{};
  std::array<double, kNumPhases> current_{};
  std::array<std::vector<double>, kNumPhases> samples_{};
  std::vector<double> total_;
};

}  // namespace flotilla::worker
