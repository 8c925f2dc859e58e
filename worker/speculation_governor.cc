#include "worker/speculation_governor.h"

#include <algorithm>
#include <bit>
#include <cmath>

namespace flotilla::worker {
namespace {

// The acceptance estimate forgets its past by sequences, not steps: each
// sequence verified keeps 1 - kSequenceSmoothing of the weight before it,
// and a step at most 1 - kStepSmoothing (recent steps count most, since
// acceptance drifts with the requests). One sequence accepts 0 to K tokens a
// step, so at batch 1 a step-weighted average swings by most of a token;
// weighted by sequences it averages ~64 steps there, ~8 at 8 sequences and
// ~4 (the step bound) at 19 and more.
constexpr double kStepSmoothing = 0.25;
constexpr double kSequenceSmoothing = 1.0 / 64;

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
  auto missing = [&b](int k) {
    return b.by_length[k].samples < kMinSamples || b.by_length[k].sequences < kMinSequences;
  };
  if (missing(max_length)) return max_length;
  if (missing(0)) return 0;
  for (int k = max_length - 1; k >= 1; --k) {
    if (missing(k)) return k;
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
  const double keep = std::max(1 - kStepSmoothing,
                               std::pow(1 - kSequenceSmoothing, static_cast<double>(s.decoding)));
  e.accepted_weight = e.accepted_weight * keep + static_cast<double>(s.accepted);
  e.sequence_weight = e.sequence_weight * keep + static_cast<double>(s.decoding);
  e.accepted_per_sequence = e.accepted_weight / e.sequence_weight;
  e.recent_us[e.samples % kTimeWindow] = s.micros;
  ++e.samples;
  e.sequences += s.decoding;
  e.step_us = Median(e.recent_us, std::min(e.samples, kTimeWindow));
}

SpeculationGovernor::Estimate SpeculationGovernor::EstimateAt(int64_t decoding, int length) const {
  if (length < 0 || length > kMaxLength) return {};
  return buckets_[BucketOf(decoding)].by_length[length];
}

}  // namespace flotilla::worker
