// CPU reference: element-wise dtype conversion between bf16 and f32.
#pragma once

#include <cstddef>
#include <cstdint>

namespace flotilla::kernels::cpu {

void Bf16ToF32(const uint16_t* in, float* out, size_t n);
void F32ToBf16(const float* in, uint16_t* out, size_t n);

}  // namespace flotilla::kernels::cpu
