// CUDA: token sampling over f32 logits (CPU reference: worker/engine/sampler.h,
// the same order of operations: temperature, top-k, top-p, then a draw).
// Pure CUDA runtime; no Abseil, gRPC or protobuf.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace flotilla::kernels::cuda {

// Per-row parameters (device array of `rows`).
struct SamplingRow {
  float temperature = 0.0f;  // <= 0: greedy (argmax, ties to the lower id)
  int32_t top_k = 0;         // 0: off
  float top_p = 1.0f;        // 1: off
  float min_p = 0.0f;        // 0: off; drop ids below min_p * p(most likely)
  uint64_t seed = 0;         // with `step`, drives a counter-based RNG (Philox)
  uint64_t step = 0;
};

// Device scratch LaunchSample needs for `rows` x `vocab` (per-segment
// partials); enough for every launch of at most `rows` rows.
size_t SampleWorkspaceBytes(int rows, int vocab);

// For each row r of logits [rows, vocab]: tokens[r] = the sampled id;
// logprobs[r] (nullptr: not wanted) = log softmax(logits[r])[token] of the raw
// logits (temperature 1, before top-k/top-p, as the OpenAI API reports);
// if top_n > 0, top_ids / top_logprobs [rows, top_n] receive the top_n most
// likely ids of the raw distribution and their log-probabilities (most likely
// first, ties to the lower id; top_n <= 64).
cudaError_t LaunchSample(const float* logits, int rows, int vocab, const SamplingRow* params,
                         int32_t* tokens, float* logprobs, int top_n, int32_t* top_ids,
                         float* top_logprobs, void* workspace, size_t workspace_bytes,
                         cudaStream_t stream);

// Sparse changes to logit rows before a draw: penalties and logit bias
// (CPU reference: Sampler::Adjustments and AdjustLogit in worker/engine/sampler.h).
// At most one entry per (row, token).
struct LogitAdjustmentEntry {
  int32_t row = 0;
  int32_t token = 0;
  float repetition = 1.0f;  // != 1: positive logits divided by it, negative multiplied
  float add = 0.0f;         // then added
};

// For the first *count (a device int, <= capacity) entries: saved[i] = the
// logit, then logit = adjusted. Graph-safe: the grid depends on capacity only.
cudaError_t LaunchAdjustLogits(float* logits, int vocab, const LogitAdjustmentEntry* entries,
                               const int32_t* count, int capacity, float* saved,
                               cudaStream_t stream);
// Puts the saved logits back.
cudaError_t LaunchRestoreLogits(float* logits, int vocab, const LogitAdjustmentEntry* entries,
                                const int32_t* count, int capacity, const float* saved,
                                cudaStream_t stream);
// Token masks (structured outputs; CPU reference: MaskLogits in
// worker/engine/sampler.h): bit t & 31 of word t >> 5 of a mask is set when
// token t is allowed; a mask is (vocab + 31) / 32 words. For the first
// *count (a device int, <= capacity) entries i: logits[rows[i]][t] = -inf for
// every token t refused by masks[i]; allowed logits are left as they are.
// The caller leaves out masks that allow nothing (the reference ignores
// them). Graph-safe: the grid depends on capacity only.
cudaError_t LaunchMaskLogits(float* logits, int vocab, const int32_t* rows, const uint32_t* masks,
                             const int32_t* count, int capacity, cudaStream_t stream);
// LaunchMaskLogits with masks the host computes while the step runs: `rows`
// (device, capacity + 2 entries) holds the logit rows, then the count, then
// the step's number; `host_masks` and `ready` are pinned host memory
// (addressable from the device). Each block waits until *ready equals the
// step's number (the host stores it with release once the masks are
// written) and then masks as LaunchMaskLogits does. Past `timeout_ns` it
// sets *late (device) to 1 and masks nothing, for the host to fail the step.
// A mask that allows nothing must be written as one that allows everything.
cudaError_t LaunchMaskLogitsWhenReady(float* logits, int vocab, const int32_t* rows,
                                      const uint32_t* host_masks, int capacity,
                                      const int32_t* ready, uint64_t timeout_ns, int32_t* late,
                                      cudaStream_t stream);
// logprobs[r] = log softmax(logits[r])[tokens[r]], from a reference token of
// the same row whose log-probability is known (e.g. the argmax and its
// logprob from a greedy LaunchSample): logit[t] - (logit[ref] - ref_logprob).
cudaError_t LaunchLogprobsFromReference(const float* logits, int rows, int vocab,
                                        const int32_t* tokens, const int32_t* ref_tokens,
                                        const float* ref_logprobs, float* logprobs,
                                        cudaStream_t stream);

// Loads every sampling kernel now (lazy module loading would load each at its
// first launch, which may wait for the device). A step whose masks the host
// writes after the launch (LaunchMaskLogitsWhenReady) must not launch a
// kernel for the first time behind the waiting one: call this once first.
cudaError_t LoadSamplingKernels();
// Its parts, one per file of kernels.
cudaError_t LoadAdjustKernels();
cudaError_t LoadMaskKernels();

}  // namespace flotilla::kernels::cuda
