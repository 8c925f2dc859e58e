// The CUDA engine's sampler on the device: each row's parameters
// (temperature, top-k, top-p, min-p, seed, draw count), penalties and
// logit bias as sparse adjustments, token masks of structured-output rows,
// logprobs and top logprobs, staged in pinned buffers, uploaded with the
// step's metadata, drawn inside the step (graphs included) and brought back.
// Behind CudaEngine's sampling entries: Step with the items' samplers and
// StepAndSample's explicit rows. Not thread-safe: one owner.
#pragma once

#include <cuda_runtime_api.h>

#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/cuda/sampling.h"
#include "worker/engine/cuda_engine.h"
#include "worker/engine/engine.h"

namespace flotilla {

struct CudaDeviceState;  // worker/engine/cuda_engine_state.h
struct StepLayout;       // worker/engine/step_layout.h

// One step's sampling on the device: per item, its row's parameters and
// its sampler (null for StepAndSample's rows and for items verified on the
// host); the adjustments staged in the pinned buffer (rows = item indices
// until Upload maps them).
struct DeviceSampling {
  std::vector<kernels::cuda::SamplingRow> rows;
  std::vector<Sampler*> samplers;
  // Per item: its drafted chunk is verified on the host (VerifiedOnHost,
  // draft_verify.h): the device draws nothing for it and Collect brings
  // back its logit rows for VerifyDraft. Empty for StepAndSample.
  std::vector<bool> host_verified;
  bool HostVerified(size_t item) const {
    return item < host_verified.size() && host_verified[item];
  }
  int adjustments = 0;
  int masks = 0;                 // rows with a token mask slot
  std::vector<Sampler*> masked;  // their samplers, by slot
  int top_n = 0;
  bool logprobs = false;  // some row reports logprobs
};

class DeviceSampler {
 public:
  // Draws with `d`'s sampling buffers over `vocab` tokens.
  DeviceSampler(CudaDeviceState& d, int vocab);
  ~DeviceSampler();
  DeviceSampler(const DeviceSampler&) = delete;
  DeviceSampler& operator=(const DeviceSampler&) = delete;

  // The items' samplers into `sampling` (rows and adjustments staged in the
  // pinned buffers, a mask slot per structured-output row); an item whose
  // drafted chunk's draws depend on the tokens before them (penalties, bias,
  // min_tokens, a token filter) is only marked host_verified. False when
  // the step's adjustments, masks or rows (a drafted chunk has draft_tokens
  // + 1) do not fit the device buffers, or a masked row needs its raw
  // logits: host sampling of the whole step then.
  bool Prepare(const std::vector<StepItem>& items, DeviceSampling* sampling);
  // Once the step is launched: computes the masks of its structured-output
  // rows in parallel (each a copy from the shared mask cache or a walk of the
  // token trie) into the pinned slots, then tells the device they are there.
  // The step's sampling waits for this on the device, so the masks cost
  // nothing while they take less than the step's layers.
  void WriteMasks(const DeviceSampling& sampling);
  // The graph variant a sampling setup needs (adjustments, logprobs, top-n).
  static int Variant(const DeviceSampling& sampling);
  // The staged rows, adjustments and masks up to the device, item indices
  // mapped to `plan`'s logit rows.
  absl::Status Upload(const DeviceSampling& sampling, const StepLayout& plan);
  // The draws from the first `rows` logit rows on `stream`.
  absl::Status Launch(const DeviceSampling& sampling, int rows, cudaStream_t stream);
  // Brings back the drawn tokens (and logprobs, and the logit rows asked for
  // beside them or of host_verified items; `wait` waits for the stream) and
  // records the tokens in their samplers: into `out` (Step; a drafted
  // chunk's accepted tokens into out->accepted, VerifyDraft's rule) or
  // `sampled` (StepAndSample). host_verified items are left to the caller.
  absl::Status Collect(const std::vector<StepItem>& items, const DeviceSampling& sampling,
                       const StepLayout& plan, StepOutput* out, std::vector<SampledToken>* sampled,
                       const std::function<absl::Status()>& wait);

 private:
  // Stages item `index`'s token mask (structured outputs) for the device;
  // false when the step must sample on the host instead.
  bool StageMask(const StepItem& item, int index, DeviceSampling* sampling);
  absl::Status UploadMasks(const DeviceSampling& sampling, const StepLayout& plan);
  // The token drawn at logit row `row` (brought back by Collect), its
  // logprob and the top logprobs `sampler` asks for (`top` per row).
  TokenLogprob DrawnAt(const Sampler& sampler, int row, int top) const;

  CudaDeviceState& d_;
  int vocab_;
  std::unique_ptr<kernels::cpu::ThreadPool> mask_pool_;  // WriteMasks, made at first use
  int32_t mask_step_ = 0;                                // the number of the last step with masks
};

}  // namespace flotilla
