#include "worker/engine/stop_rules.h"

#include <algorithm>

namespace flotilla {

StopDecision StopRules::Check(int32_t token, int64_t kept) const {
  if (std::find(stop_ids_.begin(), stop_ids_.end(), token) != stop_ids_.end()) {
    return StopDecision::kStop;
  }
  return kept + 1 >= max_new_ ? StopDecision::kLength : StopDecision::kContinue;
}

}  // namespace flotilla
