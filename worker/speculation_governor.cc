#include "worker/speculation_governor.h"

#include <algorithm>
#include <bit>

namespace flotilla::worker {
namespace {

// Weight of a new sample in the moving averages: recent steps count most,
// since acceptance and batch shapes drift with the requests.
constexpr double kSmoothing = 0.25;

void Average(double& value, int samples, double sample) {
  value = samples == 0 ? sample : value + kSmoothing * (sample - value);
}

// The median of the first `n` of `values` (the upper one of an even count).
double Median(std::array<double, SpeculationGovernor::kTimeWindow> values, int n) {
  std::nth_element(values.begin(), values.begin() + n / 2, values.begin() + n);
  return values[n / 2];
}

// Tokens a step of this estimate gives per sequence and microsecond.
double Rate(const SpeculationGovernor::Estimate& e) {
  return (1 + e.accepted_per_sequence) / e.step_us;
}

}  // namespace

size_t SpeculationGovernor::BucketOf(int64_t decoding) {
  const auto n = static_cast<uint64_t>(std::max<int64_t>(decoding, 1));
  return std::min<size_t>(std::bit_width(n) - 1, std::tuple_size_v<decltype(buckets_)> - 1);
}

int SpeculationGovernor::Unmeasured(const Bucket& b, int max_length) {
  if (b.by_length[max_length].samples < kMinSamples) return max_length;
  if (b.by_length[0].samples < kMinSamples) return 0;
  for (int k = max_length - 1; k >= 1; --k) {
    if (b.by_length[k].samples < kMinSamples) return k;
  }
  return -1;
}

int SpeculationGovernor::DraftLength(int64_t decoding, int max_length) {
  max_length = std::clamp(max_length, 0, kMaxLength);
  if (max_length == 0) return 0;
  Bucket& b = buckets_[BucketOf(decoding)];
  if (const int k = Unmeasured(b, max_length); k >= 0) return k;
  int best = 0;
  for (int k = 1; k <= max_length; ++k) {
    if (Rate(b.by_length[k]) > Rate(b.by_length[best])) best = k;
  }
  if (++b.decisions % kExploreEvery != 0) return best;
  // Exploring: the next length after the last one explored, skipping the best.
  int k = b.explored;
  do {
    k = (k + 1) % (max_length + 1);
  } while (k == best);
  b.explored = k;
  return k;
}

void SpeculationGovernor::Record(const Sample& s) {
  if (s.decoding <= 0 || s.micros <= 0) return;
  // A step whose drafters proposed nothing is a plain step, whatever length
  // it was planned with.
  const int length = s.drafted == 0 ? 0 : s.length;
  if (length < 0 || length > kMaxLength || (length == 0 && s.drafted != 0)) return;
  Estimate& e = buckets_[BucketOf(s.decoding)].by_length[length];
  Average(e.accepted_per_sequence, e.samples,
          static_cast<double>(s.accepted) / static_cast<double>(s.decoding));
  e.recent_us[e.samples % kTimeWindow] = s.micros;
  ++e.samples;
  e.step_us = Median(e.recent_us, std::min(e.samples, kTimeWindow));
}

SpeculationGovernor::Estimate SpeculationGovernor::EstimateAt(int64_t decoding, int length) const {
  if (length < 0 || length > kMaxLength) return {};
  return buckets_[BucketOf(decoding)].by_length[length];
}

}  // namespace flotilla::worker
