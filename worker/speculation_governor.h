// How many tokens a decode step drafts per sequence, from what the worker
// measured: per batch size (decoding sequences, in power-of-two buckets) and
// per draft length K (the most drafted tokens a sequence brings; K = 0 is a
// plain step), the time of decode steps planned with K and the drafted tokens
// they accepted per sequence. A step takes the K whose measured output per
// unit of time, (1 + accepted per sequence) / step time, is highest.
// Verifying K tokens per sequence multiplies a batch's work and each drafted
// token brings other experts' weights into the step, so the best K falls as
// the batch grows (to 0 where drafting stops paying); where that happens
// depends on the engine, the GPU and the workload's acceptance, so it is
// measured rather than fixed.
//
// Each bucket first measures a few steps (at least kMinSequences sequences)
// of the longest K, then plain ones,
// then the lengths between, then decides; one decision in kExploreEvery takes
// another K (in turn), so that an estimate that lost keeps being refreshed
// (acceptance changes with the requests). Only decode-only steps are
// measured: a step that also prefills a prompt chunk says nothing about
// drafting. A length's acceptance is averaged over the sequences it
// verified (decayed by sequences: see kSequenceSmoothing), so that one
// sequence's noisy acceptance at batch 1 (0 to K tokens a step) does not let
// a lucky estimate of a rarely taken length beat the one taken: on one H200
// at batch 1 a step-weighted average took 1 drafted token about half the time
// where 2 give most. A length's step time is the median of its last kTimeWindow
// steps, not a moving average: the first step of a new shape captures a CUDA
// graph or runs eagerly (tens to hundreds of milliseconds against a 3-50 ms
// step), and a length measured only by exploring decisions (one in
// kExploreEvery) would carry such an outlier for thousands of steps; on one
// H200 that kept the average choosing 1 drafted token at batch 64 where
// 2 give most (served acceptance length 1.83 instead of 2.5).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace flotilla::worker {

class SpeculationGovernor {
 public:
  // Measured steps, and sequences in them, of each draft length a bucket
  // needs before it decides (small batches take more steps: one sequence's
  // acceptance is noisy).
  static constexpr int kMinSamples = 4;
  static constexpr int64_t kMinSequences = 16;
  // One decision in this many, per bucket, goes against the estimates.
  static constexpr uint64_t kExploreEvery = 64;
  // The longest draft length measured apart (kMaxSpeculativeTokens).
  static constexpr int kMaxLength = 16;
  // Steps whose median is a length's step time.
  static constexpr int kTimeWindow = 8;

  // A decode-only step: `decoding` sequences, planned with at most `length`
  // drafted tokens per sequence, `drafted` tokens verified (0: a plain step,
  // whatever its length), `accepted` of them, `micros` from plan to result.
  struct Sample {
    int64_t decoding = 0;
    int length = 0;
    int64_t drafted = 0;
    int64_t accepted = 0;
    double micros = 0;
  };

  // The most drafted tokens per sequence for the next step of `decoding`
  // sequences, in [0, max_length] (max_length: what the sequences' drafters
  // would draft, at most kMaxLength).
  int DraftLength(int64_t decoding, int max_length);
  void Record(const Sample& sample);

  // A bucket's estimates for one draft length, for tests and the worker's
  // log (length 0: plain steps).
  struct Estimate {
    double step_us = 0;                // the median of `recent_us`
    double accepted_per_sequence = 0;  // accepted_weight / sequence_weight
    double accepted_weight = 0;        // accepted tokens, older steps decayed
    double sequence_weight = 0;        // sequences verified, decayed alike
    int samples = 0;
    int64_t sequences = 0;                        // verified in those samples
    std::array<double, kTimeWindow> recent_us{};  // the last steps' times, a ring
  };
  Estimate EstimateAt(int64_t decoding, int length) const;

 private:
  struct Bucket {
    std::array<Estimate, kMaxLength + 1> by_length{};
    uint64_t decisions = 0;
    int explored = 0;  // the last length an exploring decision took
  };
  static size_t BucketOf(int64_t decoding);
  // The lengths in the order a new bucket measures them: max_length, 0,
  // then max_length - 1 down to 1. -1 when every one has its samples.
  static int Unmeasured(const Bucket& b, int max_length);

  std::array<Bucket, 24> buckets_{};
};

}  // namespace flotilla::worker
