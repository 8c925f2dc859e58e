#include "worker/replay_drafter.h"

#include <algorithm>
#include <bit>
#include <cmath>

namespace flotilla::worker {
namespace {

uint64_t Mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

uint64_t Combine(uint64_t h, uint64_t v) { return Mix(h ^ Mix(v)); }

uint64_t FloatBits(float f) { return std::bit_cast<uint32_t>(f); }

}  // namespace

uint64_t ReplayKey(absl::Span<const int32_t> prompt, const SamplingParams& params) {
  if (params.temperature != 0.0f && !params.seed.has_value()) return 0;
  uint64_t h = Mix(prompt.size());
  for (int32_t t : prompt) h = Combine(h, static_cast<uint32_t>(t));
  h = Combine(h, FloatBits(params.temperature));
  if (params.temperature != 0.0f) {
    h = Combine(h, FloatBits(params.top_p));
    h = Combine(h, static_cast<uint64_t>(params.top_k));
    h = Combine(h, FloatBits(params.min_p));
    h = Combine(h, *params.seed);
  }
  h = Combine(h, FloatBits(params.frequency_penalty));
  h = Combine(h, FloatBits(params.presence_penalty));
  h = Combine(h, FloatBits(params.repetition_penalty));
  std::vector<std::pair<int32_t, float>> bias = params.logit_bias;  // in any order
  std::sort(bias.begin(), bias.end());
  for (const auto& [token, value] : bias) {
    h = Combine(Combine(h, static_cast<uint32_t>(token)), FloatBits(value));
  }
  h = Combine(h, static_cast<uint64_t>(params.min_tokens));
  return h == 0 ? 1 : h;
}

void ReplayRecordings::Record(uint64_t key, absl::Span<const int32_t> output) {
  const int64_t n = static_cast<int64_t>(output.size());
  if (key == 0 || n == 0 || n > max_tokens_) return;
  auto [it, inserted] = outputs_.try_emplace(key);
  tokens_ += n - static_cast<int64_t>(it->second.size());
  it->second.assign(output.begin(), output.end());
  order_.push_back(key);
  while (tokens_ > max_tokens_ && !order_.empty()) {
    const uint64_t oldest = order_.front();
    order_.pop_front();
    // A key recorded again later stays until its last entry comes up.
    if (std::find(order_.begin(), order_.end(), oldest) != order_.end()) continue;
    auto old = outputs_.find(oldest);
    if (old == outputs_.end()) continue;
    tokens_ -= static_cast<int64_t>(old->second.size());
    outputs_.erase(old);
  }
}

const std::vector<int32_t>* ReplayRecordings::Find(uint64_t key) const {
  auto it = outputs_.find(key);
  return it == outputs_.end() ? nullptr : &it->second;
}

std::vector<int32_t> ProposeReplayDraft(const std::vector<int32_t>& recorded,
                                        absl::Span<const int32_t> generated, int k,
                                        double error_rate, uint64_t salt, int vocab) {
  const size_t at = generated.size();
  if (k <= 0 || at >= recorded.size() || vocab < 2) return {};
  if (!std::equal(generated.begin(), generated.end(), recorded.begin())) return {};
  const size_t end = std::min(recorded.size(), at + static_cast<size_t>(k));
  std::vector<int32_t> draft(recorded.begin() + at, recorded.begin() + end);
  for (size_t j = 0; j < draft.size(); ++j) {
    const uint64_t r = Mix(Combine(salt, at + j));
    // The top 53 bits as a uniform in [0, 1).
    const double u = static_cast<double>(r >> 11) * 0x1.0p-53;
    if (u >= error_rate) continue;
    // Another token: shifted by 1 .. vocab - 1.
    const int64_t shift = 1 + static_cast<int64_t>(Mix(r) % static_cast<uint64_t>(vocab - 1));
    draft[j] = static_cast<int32_t>((draft[j] + shift) % vocab);
  }
  return draft;
}

double ExpectedReplayAcceptanceLength(double error_rate, int k) {
  const double q = 1.0 - error_rate;
  double length = 1.0, term = 1.0;
  for (int i = 0; i < k; ++i) {
    term *= q;
    length += term;
  }
  return length;
}

double ReplayErrorRateFor(double acceptance_length, int k) {
  double lo = 0.0, hi = 1.0;  // the length falls as the rate rises
  for (int i = 0; i < 60; ++i) {
    const double mid = (lo + hi) / 2;
    (ExpectedReplayAcceptanceLength(mid, k) > acceptance_length ? lo : hi) = mid;
  }
  return (lo + hi) / 2;
}

}  // namespace flotilla::worker
