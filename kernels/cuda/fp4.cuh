// Device helpers that turn MXFP4 bytes into f16 tensor-core operands, shared
// by the decode kernels (moe.cu) and the grouped GEMMs (moe_gemm.cu).
// Included by .cu files only.
//
// FP4 nibble n = [s e1 e0 m] with its 3 magnitude bits at f16 bits 9..11 and
// its sign at bit 15 is exactly fp4 * 2^-14 (0.5 is the f16 subnormal 2^-15);
// callers put the 2^14 back with the block scale.
#pragma once

#include <cstdint>

namespace flotilla::kernels::cuda {

// f16x2 of nibbles k (low half) and k + 4 (high half) of `w`, times 2^-14.
template <int k>
__device__ __forceinline__ uint32_t Fp4PairF16(uint32_t w) {
  constexpr int kMag = 9 - 4 * k, kSign = 12 - 4 * k;
  const uint32_t m = kMag >= 0 ? (w << (kMag >= 0 ? kMag : 0)) : (w >> (kMag < 0 ? -kMag : 0));
  const uint32_t s = kSign >= 0 ? (w << (kSign >= 0 ? kSign : 0)) : (w >> (kSign < 0 ? -kSign : 0));
  return (m & 0x0E000E00u) | (s & 0x80008000u);
}

// The four pairs (k, k + 4) of a word, k = 0..3. kPrmt: through bytes, each
// nibble becoming the high byte of its f16, [s 0 0 0 e1 e0 m 0], the even
// nibbles in one word and the odd ones in another (3-4 operations each), then
// one byte permute per pair (11 operations per word); else shifts and masks
// per pair.
struct Fp4Pairs {
  uint32_t p[4];
};
template <bool kPrmt = true>
__device__ __forceinline__ Fp4Pairs DecodeWord(uint32_t w) {
  if constexpr (kPrmt) {
    const uint32_t even = ((w << 1) & 0x0E0E0E0Eu) | ((w << 4) & 0x80808080u);
    const uint32_t odd = ((w >> 3) & 0x0E0E0E0Eu) | (w & 0x80808080u);
    return {{__byte_perm(even, 0u, 0x2404), __byte_perm(odd, 0u, 0x2404),
             __byte_perm(even, 0u, 0x3414), __byte_perm(odd, 0u, 0x3414)}};
  } else {
    return {{Fp4PairF16<0>(w), Fp4PairF16<1>(w), Fp4PairF16<2>(w), Fp4PairF16<3>(w)}};
  }
}

}  // namespace flotilla::kernels::cuda
