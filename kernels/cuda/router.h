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

}  // namespace flotilla::kernels::cuda
