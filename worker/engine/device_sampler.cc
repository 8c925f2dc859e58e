#include "worker/engine/device_sampler.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "kernels/cuda/sampling.h"
#include "worker/engine/cuda_engine_state.h"
#include "worker/engine/draft_verify.h"
#include "worker/engine/step_layout.h"

namespace flotilla {

namespace kc = kernels::cuda;

// How long the device waits for a step's masks (WriteMasks runs right after
// the launch; only a host that stopped would take this long).
constexpr uint64_t kMaskWaitNs = 30ull * 1000 * 1000 * 1000;

DeviceSampler::DeviceSampler(CudaDeviceState& d, int vocab) : d_(d), vocab_(vocab) {}

DeviceSampler::~DeviceSampler() = default;

void DeviceSampler::WriteMasks(const DeviceSampling& sampling) {
  CudaDeviceState& d = d_;
  const int n = sampling.masks;
  if (n == 0) return;
  auto write = [&](int64_t begin, int64_t end) {
    for (int64_t m = begin; m < end; ++m) {
      uint32_t* dst = d.masks_host + static_cast<size_t>(m) * d.mask_words;
      const uint32_t* allowed = sampling.masked[static_cast<size_t>(m)]->Allowed();
      // A mask that allows nothing is ignored, as the CPU sampler ignores it
      // (the filter reports the failure when the token is recorded).
      if (allowed == nullptr ||
          std::all_of(allowed, allowed + d.mask_words, [](uint32_t w) { return w == 0; })) {
        std::fill(dst, dst + d.mask_words, ~0u);
      } else {
        std::memcpy(dst, allowed, d.mask_words * sizeof(uint32_t));
      }
    }
  };
  if (n == 1) {
    write(0, 1);
  } else {
    if (mask_pool_ == nullptr) {
      // Threads of their own, while the device runs the step.
      const int cores = static_cast<int>(std::thread::hardware_concurrency());
      mask_pool_ = std::make_unique<kernels::cpu::ThreadPool>(std::clamp(cores / 2, 2, 8));
    }
    mask_pool_->ParallelFor(n, write);
  }
  std::atomic_ref<int32_t>(*d.mask_ready).store(mask_step_, std::memory_order_release);
}

bool DeviceSampler::Prepare(const std::vector<StepItem>& items, DeviceSampling* sampling) {
  CudaDeviceState& d = d_;
  sampling->rows.assign(items.size(), kc::SamplingRow{});
  sampling->samplers.assign(items.size(), nullptr);
  sampling->host_verified.assign(items.size(), false);
  int rows = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    Sampler* sampler = items[i].sampler;
    rows +=
        sampler != nullptr || items[i].logits != LogitsMode::kNone ? 1 + items[i].draft_tokens : 0;
    if (sampler == nullptr) continue;
    if (VerifiedOnHost(items[i])) {
      // Its logit rows come back for VerifyDraft; nothing of it is staged
      // (no mask or adjustment touches its raw logits).
      sampling->host_verified[i] = true;
      continue;
    }
    const SamplingParams& p = sampler->params();
    if (sampler->has_filter() && !StageMask(items[i], static_cast<int>(i), sampling)) return false;
    kc::SamplingRow& row = sampling->rows[i];
    row.temperature = p.temperature;
    row.top_k = p.top_k;
    row.top_p = p.top_p;
    row.min_p = p.min_p;
    row.seed = sampler->seed();
    row.step = sampler->draws();
    sampling->samplers[i] = sampler;
    sampling->logprobs = sampling->logprobs || p.logprobs;
    sampling->top_n = std::max(sampling->top_n, p.logprobs ? p.top_logprobs : 0);
    for (const LogitAdjustment& a : sampler->Adjustments()) {
      if (sampling->adjustments == CudaDeviceState::kAdjustCapacity) return false;
      d.adjust_host[sampling->adjustments++] =
          kc::LogitAdjustmentEntry{static_cast<int32_t>(i), a.token, a.repetition, a.add};
    }
  }
  // Drafted chunks' rows must fit the sampling buffers (one row per sequence).
  return rows <= std::min(d.max_seqs, d.logit_rows);
}

// A structured-output row gets a mask slot (a mask word per 32 tokens, ~25
// KB at o200k) that WriteMasks fills while the device runs the step, and the
// device sets its refused logits to -inf before the draw. The host samples
// instead (false) when the row wants logprobs or its logit row (both are of
// the raw logits, which the mask overwrites), or when more rows than
// mask_capacity are masked.
bool DeviceSampler::StageMask(const StepItem& item, int index, DeviceSampling* sampling) {
  CudaDeviceState& d = d_;
  if (item.sampler->params().logprobs || item.logits != LogitsMode::kNone) return false;
  if (sampling->masks == d.mask_capacity) return false;
  d.mask_rows_host[sampling->masks++] = index;  // an item index until Upload
  sampling->masked.push_back(item.sampler);
  return true;
}

int DeviceSampler::Variant(const DeviceSampling& sampling) {
  const bool adjust = sampling.adjustments > 0;
  const bool masked = sampling.masks > 0;
  return 1 + (adjust ? 2 : 0) + (adjust && sampling.logprobs ? 4 : 0) + (masked ? 8 : 0) +
         16 * sampling.top_n;
}

absl::Status DeviceSampler::Upload(const DeviceSampling& sampling, const StepLayout& plan) {
  CudaDeviceState& d = d_;
  // Padding rows draw greedily.
  for (int r = 0; r < std::max(plan.rows, plan.seqs); ++r) d.params_host[r] = kc::SamplingRow{};
  for (int i = 0; i < plan.real_items; ++i) {
    // A drafted chunk's j-th row draws as the sampler would after j more
    // draws (Prepare checked nothing else changes).
    for (int j = 0; j < plan.row_count[i]; ++j) {
      kc::SamplingRow row = sampling.rows[i];
      row.step += static_cast<uint64_t>(j);
      d.params_host[plan.first_row[i] + j] = row;
    }
  }
  FLOTILLA_CUDA_RETURN(cudaMemcpyAsync(d.sample_params, d.params_host,
                                       std::max(plan.rows, 1) * sizeof(kc::SamplingRow),
                                       cudaMemcpyHostToDevice, d.stream));
  FLOTILLA_RETURN_IF_ERROR(UploadMasks(sampling, plan));
  if (sampling.adjustments == 0) return absl::OkStatus();
  // Item indices to logit rows; the count travels after the entries.
  for (int e = 0; e < sampling.adjustments; ++e) {
    d.adjust_host[e].row = plan.first_row[d.adjust_host[e].row];
  }
  int32_t* count = reinterpret_cast<int32_t*>(d.adjust_host + CudaDeviceState::kAdjustCapacity);
  *count = sampling.adjustments;
  FLOTILLA_CUDA_RETURN(cudaMemcpyAsync(d.adjust, d.adjust_host,
                                       sampling.adjustments * sizeof(kc::LogitAdjustmentEntry),
                                       cudaMemcpyHostToDevice, d.stream));
  FLOTILLA_CUDA_RETURN(
      cudaMemcpyAsync(d.adjust_count, count, sizeof(int32_t), cudaMemcpyHostToDevice, d.stream));
  return absl::OkStatus();
}

absl::Status DeviceSampler::UploadMasks(const DeviceSampling& sampling, const StepLayout& plan) {
  CudaDeviceState& d = d_;
  if (sampling.masks == 0) return absl::OkStatus();
  for (int m = 0; m < sampling.masks; ++m) {
    d.mask_rows_host[m] = plan.first_row[d.mask_rows_host[m]];
  }
  d.mask_rows_host[d.mask_capacity] = sampling.masks;
  // The step's number, never 0 (what mask_ready starts at).
  mask_step_ = mask_step_ == INT32_MAX ? 1 : mask_step_ + 1;
  d.mask_rows_host[d.mask_capacity + 1] = mask_step_;
  FLOTILLA_CUDA_RETURN(cudaMemcpyAsync(d.mask_rows, d.mask_rows_host,
                                       (d.mask_capacity + 2) * sizeof(int32_t),
                                       cudaMemcpyHostToDevice, d.stream));
  return absl::OkStatus();
}

// Masks go first: the rows they cover report no logprobs (StageMask), so
// the raw-logprob passes below never need their refused logits back.
// Without adjustments one draw reports the raw logprobs itself. With them the
// draw runs on the adjusted rows, which are then restored, and a greedy draw
// over the raw rows gives the top logprobs and the normaliser for the drawn
// token's raw logprob (OpenAI and the CPU sampler report raw logprobs).
absl::Status DeviceSampler::Launch(const DeviceSampling& sampling, int rows, cudaStream_t s) {
  CudaDeviceState& d = d_;
  const int V = vocab_, cap = CudaDeviceState::kAdjustCapacity;
  if (sampling.masks > 0) {
    FLOTILLA_CUDA_RETURN(kc::LaunchMaskLogitsWhenReady(d.logits, V, d.mask_rows, d.masks_host,
                                                       d.mask_capacity, d.mask_ready, kMaskWaitNs,
                                                       d.mask_late, s));
  }
  if (sampling.adjustments == 0) {
    FLOTILLA_CUDA_RETURN(kc::LaunchSample(d.logits, rows, V, d.sample_params, d.sampled_tokens,
                                          d.sampled_logprobs, sampling.top_n, d.top_ids,
                                          d.top_logprobs, d.sample_ws, d.sample_ws_bytes, s));
    return absl::OkStatus();
  }
  FLOTILLA_CUDA_RETURN(
      kc::LaunchAdjustLogits(d.logits, V, d.adjust, d.adjust_count, cap, d.adjust_saved, s));
  FLOTILLA_CUDA_RETURN(kc::LaunchSample(d.logits, rows, V, d.sample_params, d.sampled_tokens,
                                        nullptr, 0, nullptr, nullptr, d.sample_ws,
                                        d.sample_ws_bytes, s));
  FLOTILLA_CUDA_RETURN(
      kc::LaunchRestoreLogits(d.logits, V, d.adjust, d.adjust_count, cap, d.adjust_saved, s));
  if (!sampling.logprobs) return absl::OkStatus();
  FLOTILLA_CUDA_RETURN(kc::LaunchSample(d.logits, rows, V, d.greedy_params, d.ref_tokens,
                                        d.ref_logprobs, sampling.top_n, d.top_ids, d.top_logprobs,
                                        d.sample_ws, d.sample_ws_bytes, s));
  FLOTILLA_CUDA_RETURN(kc::LaunchLogprobsFromReference(
      d.logits, rows, V, d.sampled_tokens, d.ref_tokens, d.ref_logprobs, d.sampled_logprobs, s));
  return absl::OkStatus();
}

// Brings back the drawn tokens (and logprobs, and the logit rows asked for
// beside them) and records the tokens in their samplers.
absl::Status DeviceSampler::Collect(const std::vector<StepItem>& items,
                                    const DeviceSampling& sampling, const StepLayout& plan,
                                    StepOutput* out, std::vector<SampledToken>* sampled,
                                    const std::function<absl::Status()>& wait) {
  CudaDeviceState& d = d_;
  const int V = vocab_, rows = plan.rows, top = sampling.top_n;
  cudaStream_t s = d.stream;
  FLOTILLA_CUDA_RETURN(cudaMemcpyAsync(d.tokens_host, d.sampled_tokens, rows * sizeof(int32_t),
                                       cudaMemcpyDeviceToHost, s));
  FLOTILLA_CUDA_RETURN(cudaMemcpyAsync(d.logprobs_host, d.sampled_logprobs, rows * sizeof(float),
                                       cudaMemcpyDeviceToHost, s));
  if (sampling.masks > 0) {
    FLOTILLA_CUDA_RETURN(
        cudaMemcpyAsync(d.mask_late_host, d.mask_late, sizeof(int32_t), cudaMemcpyDeviceToHost, s));
  }
  if (top > 0) {
    FLOTILLA_CUDA_RETURN(cudaMemcpyAsync(d.top_ids_host, d.top_ids,
                                         static_cast<size_t>(rows) * top * sizeof(int32_t),
                                         cudaMemcpyDeviceToHost, s));
    FLOTILLA_CUDA_RETURN(cudaMemcpyAsync(d.top_logprobs_host, d.top_logprobs,
                                         static_cast<size_t>(rows) * top * sizeof(float),
                                         cudaMemcpyDeviceToHost, s));
  }
  if (out != nullptr) {
    out->logits.assign(items.size(), {});
    for (size_t i = 0; i < items.size(); ++i) {
      const bool wanted = items[i].logits == LogitsMode::kLast || sampling.HostVerified(i);
      if (!wanted || plan.row_count[i] == 0) continue;
      const size_t n = static_cast<size_t>(plan.row_count[i]) * V;
      out->logits[i].resize(n);
      FLOTILLA_CUDA_RETURN(cudaMemcpyAsync(out->logits[i].data(),
                                           d.logits + static_cast<size_t>(plan.first_row[i]) * V,
                                           n * sizeof(float), cudaMemcpyDeviceToHost, s));
    }
  }
  FLOTILLA_RETURN_IF_ERROR(wait());
  if (sampling.masks > 0 && *d.mask_late_host != 0) {
    *d.mask_late_host = 0;
    FLOTILLA_CUDA_RETURN(cudaMemsetAsync(d.mask_late, 0, sizeof(int32_t), s));
    return absl::InternalError(absl::StrCat("structured outputs: the step's token masks were not ",
                                            "written within ", kMaskWaitNs / 1000000000,
                                            " s of its launch"));
  }
  if (sampled != nullptr) {
    sampled->resize(plan.real_items);
    for (int i = 0; i < plan.real_items; ++i) {
      const int r = plan.first_row[i];
      (*sampled)[i] = SampledToken{d.tokens_host[r], d.logprobs_host[r]};
    }
  }
  if (out == nullptr) return absl::OkStatus();
  out->sampled.assign(items.size(), TokenLogprob{});
  out->accepted.assign(items.size(), {});
  for (size_t i = 0; i < items.size(); ++i) {
    Sampler* sampler = sampling.samplers[i];
    if (sampler == nullptr) continue;
    // VerifyDraft's rule over the rows drawn on the device: a drafted token
    // is accepted while the draw at its row equals it; the first other draw
    // (or the one after a fully accepted draft) is the step's token.
    const std::vector<int32_t>& tokens = items[i].tokens;
    const int draft = items[i].draft_tokens;
    for (int j = 0; j <= draft; ++j) {
      TokenLogprob drawn = DrawnAt(*sampler, plan.first_row[i] + j, top);
      sampler->Record(drawn.token);
      if (j == draft || drawn.token != tokens[tokens.size() - draft + j]) {
        out->sampled[i] = std::move(drawn);
        break;
      }
      out->accepted[i].push_back(std::move(drawn));
    }
  }
  return absl::OkStatus();
}

TokenLogprob DeviceSampler::DrawnAt(const Sampler& sampler, int row, int top) const {
  const CudaDeviceState& d = d_;
  TokenLogprob drawn;
  drawn.token = d.tokens_host[row];
  drawn.logprob = d.logprobs_host[row];
  const int n = sampler.params().logprobs ? sampler.params().top_logprobs : 0;
  for (int j = 0; j < n; ++j) {
    const size_t at = static_cast<size_t>(row) * top + j;
    drawn.top.emplace_back(d.top_ids_host[at], d.top_logprobs_host[at]);
  }
  return drawn;
}

}  // namespace flotilla
