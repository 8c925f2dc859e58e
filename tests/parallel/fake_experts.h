// A stand-in for the MoE kernel in the device context tests: each expert is
// an elementwise function of its input row whose every operation rounds
// once (no contraction: synthetic_fill.h's SyntheticAdd and SyntheticMul), so
// the host reference reproduces it bit for bit.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "common/host_device.h"
#include "common/synthetic_fill.h"

namespace flotilla::parallel::testing {

// Expert `expert` applied to element `h` of a row.
FLOTILLA_HOST_DEVICE inline float FakeExpert(float x, int expert, int h) {
  const float scale = SyntheticAdd(1.0f, SyntheticMul(static_cast<float>(expert), 0.0625f));
  const float bias = SyntheticAdd(SyntheticMul(static_cast<float>(expert), 0.01f),
                                  SyntheticMul(static_cast<float>(h % 7), 0.001f));
  return SyntheticAdd(SyntheticMul(x, scale), bias);
}

// As LaunchMoeLayer with top_k = 1: out[r, :] += ones[r] * expert(x[r, :])
// for rows whose slot is in [0, slots), the expert being expert_of_slot[slot].
cudaError_t LaunchFakeExperts(const uint16_t* x, const int32_t* slot, const float* ones,
                              int64_t rows, int hidden, const int32_t* expert_of_slot, int slots,
                              float* out, cudaStream_t stream);

}  // namespace flotilla::parallel::testing
