#include "coordinator/grpc/prompt_logits_credit.h"

#include <algorithm>

namespace flotilla::coordinator {

void PromptLogitsCredit::Received(uint64_t sequence, uint64_t bytes, bool prompt_done) {
  std::lock_guard<std::mutex> lock(mu_);
  Sequence& s = sequences_[sequence];
  s.received += bytes;
  s.done = s.done || prompt_done;
}

uint64_t PromptLogitsCredit::Taken(uint64_t sequence, uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  Sequence& s = sequences_[sequence];
  s.taken += bytes;
  const uint64_t allowed = s.taken + window_;
  if (s.done || allowed <= std::max(s.granted, window_)) return 0;
  s.granted = allowed;
  return allowed;
}

bool PromptLogitsCredit::WaitingLocked(const Sequence& s) const {
  return !s.done && s.received >= std::max(s.granted, window_);
}

bool PromptLogitsCredit::waiting() const {
  std::lock_guard<std::mutex> lock(mu_);
  return std::any_of(sequences_.begin(), sequences_.end(),
                     [this](const auto& entry) { return WaitingLocked(entry.second); });
}

}  // namespace flotilla::coordinator
