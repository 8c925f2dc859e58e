#include "coordinator/stop_filter.h"

#include <algorithm>

namespace flotilla::coordinator {

std::string StopFilter::Push(std::string_view text) {
  if (hit_) return std::string();
  pending_.append(text.data(), text.size());
  if (stops_.empty()) return std::exchange(pending_, std::string());
  size_t first = std::string::npos;
  for (const std::string& s : stops_) first = std::min(first, pending_.find(s));
  if (first != std::string::npos) {
    hit_ = true;
    std::string out = pending_.substr(0, first);
    pending_.clear();
    return out;
  }
  // Hold back the longest suffix that begins some stop string.
  size_t hold = 0;
  for (const std::string& s : stops_) {
    for (size_t k = std::min(s.size() - 1, pending_.size()); k > hold; --k) {
      if (pending_.compare(pending_.size() - k, k, s, 0, k) == 0) {
        hold = k;
        break;
      }
    }
  }
  std::string out = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string StopFilter::Flush() {
  if (hit_) return std::string();
  return std::exchange(pending_, std::string());
}

}  // namespace flotilla::coordinator
