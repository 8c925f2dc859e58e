#include "worker/step_profile.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace flotilla::worker {
namespace {

// The q-quantile of v (sorted in place), by the nearest rank.
double Quantile(std::vector<double>& v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())));
  return v[i];
}

}  // namespace

const char* StepProfile::Name(Phase phase) {
  switch (phase) {
    case kBetween:
      return "between";
    case kPlan:
      return "plan";
    case kExchange:
      return "exchange";
    case kSend:
      return "send";
    case kEngine:
      return "engine";
    case kComplete:
      return "complete";
    case kEngineLaunch:
      return "engine_launch";
    case kEngineWait:
      return "engine_wait";
    default:
      return "?";
  }
}

void StepProfile::Mark(Phase phase) {
  if (!on()) return;
  const Clock::time_point now = Clock::now();
  if (phase == kBetween) step_start_ = last_ == Clock::time_point{} ? now : last_;
  if (last_ != Clock::time_point{}) {
    current_[phase] += std::chrono::duration<double, std::micro>(now - last_).count();
  }
  last_ = now;
}

void StepProfile::AddEngineTiming(double launch_us, double wait_us) {
  if (!on()) return;
  current_[kEngineLaunch] += launch_us;
  current_[kEngineWait] += wait_us;
}

std::string StepProfile::EndStep(bool worked) {
  if (!on()) return "";
  if (worked) {
    for (int p = 0; p < kNumPhases; ++p) samples_[p].push_back(current_[p]);
    total_.push_back(std::chrono::duration<double, std::micro>(last_ - step_start_).count());
  }
  current_.fill(0);
  if (static_cast<int64_t>(total_.size()) < every_) return "";
  std::string line = absl::StrCat("{\"step_profile\":{\"steps\":", total_.size());
  for (int p = 0; p < kNumPhases; ++p) {
    absl::StrAppend(&line,
                    absl::StrFormat(",\"%s_us_p50\":%.1f,\"%s_us_p99\":%.1f",
                                    Name(static_cast<Phase>(p)), Quantile(samples_[p], 0.5),
                                    Name(static_cast<Phase>(p)), Quantile(samples_[p], 0.99)));
    samples_[p].clear();
  }
  absl::StrAppend(&line, absl::StrFormat(",\"step_us_p50\":%.1f,\"step_us_p99\":%.1f}}",
                                         Quantile(total_, 0.5), Quantile(total_, 0.99)));
  total_.clear();
  return line;
}

}  // namespace flotilla::worker
