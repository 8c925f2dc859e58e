// CUDA: router logits computed from the f32 residual stream. Routing is a
// discrete choice: rounding the normed activations to bf16 before the router
// (as the matmul inputs are) moves logits by ~2^-9 relative, enough to swap
// experts whose logits nearly tie, and a swapped expert changes the layer's
// output completely. So the router normalises the f32 residual itself and
// keeps f32 activations; it reads only E x H bf16 weights (0.7 MB for 120b).
// Pure CUDA runtime; bf16 as uint16_t.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace flotilla::kernels::cuda {

// logits[t, e] = sum_i rmsnorm(x[t, :])[i] * norm_weight[i] * w[e, i] + bias[e]
// with rmsnorm(v) = v / sqrt(mean(v^2) + eps), all in f32.
//   x f32 [tokens, hidden]; norm_weight bf16 [hidden]; w bf16 [experts, hidden];
//   bias bf16 [experts] or nullptr; logits f32 [tokens, experts].
// hidden % 8 == 0 and hidden <= 8192.
cudaError_t LaunchRouterLogitsF32(const float* x, const uint16_t* norm_weight, float eps,
                                  const uint16_t* w, const uint16_t* bias, int tokens, int hidden,
                                  int experts, float* logits, cudaStream_t stream);

// The same logits followed, per token, by the K largest (descending, ties to
// the lower index, as torch.topk) and the softmax over those K, in one launch:
// the last CTA to finish a group of tokens ranks them. ids int32 / weights f32
// [tokens, k]; experts <= 256, k <= 8. logits: f32 [tokens, experts] scratch
// (holds the logits afterwards); counters: RouterCounters(tokens) ints,
// zeroed once before the first call (each call leaves them at zero again, so
// a CUDA graph can replay it).
int RouterCounters(int tokens);
// normed_out (bf16 [tokens, hidden], or nullptr) also receives
// bf16(rmsnorm(x) * norm_weight) (as LaunchAddRmsNorm; the sum of squares is
// added in another order, so a value may differ by one bf16 ulp): the
// experts' input, so the layer needs no separate norm launch.
cudaError_t LaunchRouterTopKF32(const float* x, const uint16_t* norm_weight, float eps,
                                const uint16_t* w, const uint16_t* bias, int tokens, int hidden,
                                int experts, int k, int32_t* ids, float* weights, float* logits,
                                int* counters, uint16_t* normed_out, cudaStream_t stream);

}  // namespace flotilla::kernels::cuda
