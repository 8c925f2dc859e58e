#include "kernels/cpu/convert.h"

#include "common/bf16.h"

namespace flotilla::kernels::cpu {

void Bf16ToF32(const uint16_t* in, float* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = Bf16ToFloat(in[i]);
}

void F32ToBf16(const float* in, uint16_t* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = FloatToBf16(in[i]);
}

}  // namespace flotilla::kernels::cpu
