// When a generated sequence ends: the one place that decides it, shared by
// the serving loop (worker/scheduler.h) and offline generation (generate.h).
#pragma once

#include <cstdint>
#include <vector>

namespace flotilla {

enum class StopDecision {
  kContinue,  // keep the token and go on
  kStop,      // the token is a stop token: the sequence ends without it
  kLength,    // the token is kept and the sequence has reached its limit
};

class StopRules {
 public:
  // `stop_ids`: tokens that end a sequence (not part of its output);
  // `max_new`: the most tokens a sequence may keep (>= 1).
  StopRules(std::vector<int> stop_ids, int64_t max_new)
      : stop_ids_(std::move(stop_ids)), max_new_(max_new) {}

  // The decision for `token`, drawn after `kept` tokens were kept.
  StopDecision Check(int32_t token, int64_t kept) const;

  const std::vector<int>& stop_ids() const { return stop_ids_; }
  int64_t max_new() const { return max_new_; }

 private:
  std::vector<int> stop_ids_;
  int64_t max_new_ = 0;
};

}  // namespace flotilla
