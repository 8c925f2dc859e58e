#include "worker/speculation_governor.h"

#include <algorithm>
#include <bit>

namespace flotilla::worker {
namespace {

// Weight of a new sample in the moving averages: recent steps count most,
// since acceptance and batch shapes drift with the requests.
constexpr double kSmoothing = 0.25;

void Average(double& value, int& samples, double sample) {
  value = samples == 0 ? sample : value + kSmoothing * (sample - value);
  ++samples;
}

}  // namespace

size_t SpeculationGovernor::BucketOf(int64_t decoding) {
  const auto n = static_cast<uint64_t>(std::max<int64_t>(decoding, 1));
  return std::min<size_t>(std::bit_width(n) - 1, std::tuple_size_v<decltype(buckets_)> - 1);
}

bool SpeculationGovernor::ShouldDraft(int64_t decoding) {
  Bucket& b = buckets_[BucketOf(decoding)];
  const Estimate& e = b.estimate;
  if (e.drafted_samples < kMinSamples) return true;
  if (e.plain_samples < kMinSamples) return false;
  const bool drafting_wins = e.plain_us * (1 + e.accepted_per_sequence) > e.drafted_us;
  return ++b.decisions % kExploreEvery == 0 ? !drafting_wins : drafting_wins;
}

void SpeculationGovernor::Record(const Sample& s) {
  if (s.decoding <= 0 || s.micros <= 0) return;
  Estimate& e = buckets_[BucketOf(s.decoding)].estimate;
  if (s.drafted == 0) {
    Average(e.plain_us, e.plain_samples, s.micros);
    return;
  }
  int accepted_samples = e.drafted_samples;
  Average(e.accepted_per_sequence, accepted_samples,
          static_cast<double>(s.accepted) / static_cast<double>(s.decoding));
  Average(e.drafted_us, e.drafted_samples, s.micros);
}

SpeculationGovernor::Estimate SpeculationGovernor::EstimateAt(int64_t decoding) const {
  return buckets_[BucketOf(decoding)].estimate;
}

}  // namespace flotilla::worker
