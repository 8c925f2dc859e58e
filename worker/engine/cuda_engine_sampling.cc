// CudaEngine's sampling entries: Step with the items' samplers (their draws
// on the device through the DeviceSampler, or on the host from the returned
// logits when the device buffers cannot take the step, or item by item for
// drafted chunks the device cannot draw at once; drafted tokens are
// verified either way) and StepAndSample's explicit rows.
#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "kernels/cuda/sampling.h"
#include "worker/engine/cuda_engine.h"
#include "worker/engine/device_sampler.h"
#include "worker/engine/draft_verify.h"
#include "worker/engine/step_layout.h"

namespace flotilla {
namespace {

// Draws item i's tokens with its sampler on the host from its logit rows in
// out->logits[i] (the last draft_tokens + 1, as the CPU engine verifies
// them) into out->sampled[i] and out->accepted[i]; the rows go unless the
// item asked for them.
void VerifyItemOnHost(const StepItem& item, size_t i, int64_t vocab, StepOutput* out) {
  const std::vector<int32_t>& tokens = item.tokens;
  const int64_t draft = item.draft_tokens;
  const float* rows = out->logits[i].data() + out->logits[i].size() - (draft + 1) * vocab;
  VerifiedDraft v = VerifyDraft(*item.sampler, rows, vocab,
                                absl::MakeConstSpan(tokens).subspan(tokens.size() - draft));
  out->sampled[i] = std::move(v.next);
  out->accepted[i] = std::move(v.accepted);
  if (item.logits == LogitsMode::kNone) out->logits[i].clear();
}

}  // namespace

absl::StatusOr<StepOutput> CudaEngine::Step(const std::vector<StepItem>& items) {
  bool any_sampler = false, any_all = false;
  for (const StepItem& it : items) {
    any_sampler = any_sampler || it.sampler != nullptr;
    any_all = any_all || it.logits == LogitsMode::kAll;
  }
  StepOutput out;
  if (!any_sampler) {
    FLOTILLA_RETURN_IF_ERROR(RunStep(items, nullptr, &out, nullptr));
    return out;
  }
  DeviceSampling sampling;
  if (any_all || !sampler_->Prepare(items, &sampling)) {
    ++host_sampled_steps_;
    return StepWithHostSampling(items);
  }
  FLOTILLA_RETURN_IF_ERROR(RunStep(items, &sampling, &out, nullptr));
  // Items whose drafted chunk the device could not draw at once: their
  // rows came back raw, the host draws them; the other items keep the
  // device's draws (a seeded one's tokens are those of a step without
  // drafts).
  bool host_verified = false;
  for (size_t i = 0; i < items.size(); ++i) {
    if (!sampling.HostVerified(i)) continue;
    VerifyItemOnHost(items[i], i, config_.vocab_size, &out);
    host_verified = true;
  }
  if (host_verified) ++host_sampled_steps_;
  return out;
}

absl::StatusOr<StepOutput> CudaEngine::StepWithHostSampling(const std::vector<StepItem>& items) {
  std::vector<StepItem> plain = items;
  for (StepItem& it : plain) {
    if (it.sampler != nullptr && it.logits == LogitsMode::kNone) it.logits = LogitsMode::kLast;
    it.sampler = nullptr;
  }
  StepOutput out;
  FLOTILLA_RETURN_IF_ERROR(RunStep(plain, nullptr, &out, nullptr));
  const int64_t V = config_.vocab_size;
  out.sampled.resize(items.size());
  out.accepted.resize(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    if (items[i].sampler != nullptr) VerifyItemOnHost(items[i], i, V, &out);
  }
  return out;
}

absl::StatusOr<std::vector<SampledToken>> CudaEngine::StepAndSample(
    const std::vector<StepItem>& items, const std::vector<kernels::cuda::SamplingRow>& params) {
  if (params.size() != items.size()) {
    return absl::InvalidArgumentError("step: one sampling row per item is needed");
  }
  for (const StepItem& it : items) {
    if (it.draft_tokens != 0 || !it.accepted_draft.empty()) {
      return absl::InvalidArgumentError(
          "step: StepAndSample draws one token per item; drafted tokens go through Step");
    }
  }
  DeviceSampling sampling;
  sampling.rows = params;
  sampling.samplers.assign(items.size(), nullptr);
  std::vector<SampledToken> sampled;
  FLOTILLA_RETURN_IF_ERROR(RunStep(items, &sampling, nullptr, &sampled));
  return sampled;
}

}  // namespace flotilla
