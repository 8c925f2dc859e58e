// Whether a decode step drafts, from what the worker measured: per batch
// size (decoding sequences, in power-of-two buckets) the time of decode steps
// with drafts and without, and the drafted tokens those steps accepted per
// sequence. A step drafts while its expected output per unit of time is
// higher with drafts: plain_us * (1 + accepted per sequence) > drafted_us.
// Verifying k tokens per sequence multiplies a large batch's work, so the
// answer turns to "no" where the batch makes the step compute-bound; where
// that happens depends on the engine, the GPU and the workload's acceptance,
// so it is measured rather than fixed.
//
// Each bucket first measures a few drafted steps, then a few plain ones, then
// decides; one decision in kExploreEvery goes the other way, so that an
// estimate that lost keeps being refreshed (acceptance changes with the
// requests). Only decode-only steps are measured: a step that also prefills
// a prompt chunk says nothing about drafting.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace flotilla::worker {

class SpeculationGovernor {
 public:
  // Measured steps of each kind a bucket needs before it decides.
  static constexpr int kMinSamples = 4;
  // One decision in this many, per bucket, goes against the estimates.
  static constexpr uint64_t kExploreEvery = 64;

  // A decode-only step: `decoding` sequences, `drafted` tokens verified
  // (0: a plain step), `accepted` of them, `micros` from plan to result.
  struct Sample {
    int64_t decoding = 0;
    int64_t drafted = 0;
    int64_t accepted = 0;
    double micros = 0;
  };

  // Whether the next step with `decoding` decoding sequences drafts.
  bool ShouldDraft(int64_t decoding);
  void Record(const Sample& sample);

  // A bucket's estimates, for tests and the worker's log.
  struct Estimate {
    double plain_us = 0, drafted_us = 0;
    double accepted_per_sequence = 0;
    int plain_samples = 0, drafted_samples = 0;
  };
  Estimate EstimateAt(int64_t decoding) const;

 private:
  struct Bucket {
    Estimate estimate;
    uint64_t decisions = 0;
  };
  static size_t BucketOf(int64_t decoding);

  std::array<Bucket, 24> buckets_{};
};

}  // namespace flotilla::worker
