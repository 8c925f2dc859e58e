// FP8 KV write (kv_quant.h). A warp owns one (token, kv head): each lane
// reads two bf16 values of K and two of V, the warp reduces their largest
// magnitudes, and each lane stores its two e4m3 codes (one 16-bit store);
// lane 0 stores the scales.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include "kernels/cpu/kv_fp8.h"
#include "kernels/cuda/kv_quant.h"

namespace flotilla::kernels::cuda {
namespace {

constexpr int kD = 64;
constexpr int kWarpsPerBlock = 4;

__device__ __forceinline__ float WarpMax(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}

// Quantizes one lane's pair of one head (`src` bf16 x2) into `codes` with the
// head's scale; returns the scale's bf16 bits.
__device__ __forceinline__ uint16_t QuantizePair(uint32_t src, __nv_fp8x2_storage_t* codes) {
  const float lo = Bf16ToFloat(static_cast<uint16_t>(src & 0xffffu));
  const float hi = Bf16ToFloat(static_cast<uint16_t>(src >> 16));
  const float amax = WarpMax(fmaxf(fabsf(lo), fabsf(hi)));
  const uint16_t scale = cpu::KvFp8Scale(amax);
  const float s = Bf16ToFloat(scale);
  *codes = __nv_cvt_float2_to_fp8x2(make_float2(lo / s, hi / s), __NV_SATFINITE, __NV_E4M3);
  return scale;
}

__global__ void KvQuantizeKernel(const uint16_t* __restrict__ k, const uint16_t* __restrict__ v,
                                 const int32_t* __restrict__ slots, int tokens, int kv_heads,
                                 int block_size, long long cache_slots, uint8_t* __restrict__ k8,
                                 uint8_t* __restrict__ v8, long long block_bytes) {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  const int warp = blockIdx.x * kWarpsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (warp >= tokens * kv_heads) return;
  const int t = warp / kv_heads, h = warp - t * kv_heads;
  const long long slot = slots[t];
  if (slot < 0 || slot >= cache_slots) return;
  const long long blk = slot / block_size;
  const int off = static_cast<int>(slot % block_size);
  const size_t src = (static_cast<size_t>(t) * kv_heads + h) * kD + 2 * lane;
  const uint32_t kp = *reinterpret_cast<const uint32_t*>(k + src);
  const uint32_t vp = *reinterpret_cast<const uint32_t*>(v + src);
  const size_t code_at = static_cast<size_t>(blk) * block_bytes +
                         (static_cast<size_t>(h) * block_size + off) * kD + 2 * lane;
  const size_t scale_at = static_cast<size_t>(blk) * block_bytes +
                          static_cast<size_t>(kv_heads) * block_size * kD +
                          (static_cast<size_t>(h) * block_size + off) * sizeof(uint16_t);
  const uint16_t ks = QuantizePair(kp, reinterpret_cast<__nv_fp8x2_storage_t*>(k8 + code_at));
  const uint16_t vs = QuantizePair(vp, reinterpret_cast<__nv_fp8x2_storage_t*>(v8 + code_at));
  if (lane == 0) {
    *reinterpret_cast<uint16_t*>(k8 + scale_at) = ks;
    *reinterpret_cast<uint16_t*>(v8 + scale_at) = vs;
  }
}

__device__ __forceinline__ uint32_t Mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return static_cast<uint32_t>(x);
}

// One thread per 4 bytes of a block: codes with the exponent's top bit clear
// (|value| < 1, never NaN), scales in [scale_lo, 2 * scale_lo).
__global__ void FillKvFp8Kernel(uint8_t* p, long long blocks, long long block_bytes,
                                long long code_bytes, long long used_bytes, uint64_t seed,
                                float scale_lo) {
  const long long words = blocks * (block_bytes / 4);
  for (long long w = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; w < words;
       w += static_cast<long long>(gridDim.x) * blockDim.x) {
    const long long in_block = (w % (block_bytes / 4)) * 4;
    if (in_block >= used_bytes) continue;
    const uint32_t r = Mix(seed * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(w));
    uint32_t out;
    if (in_block < code_bytes) {
      out = r & 0xb7b7b7b7u;
    } else {
      const float lo = scale_lo * (1.0f + static_cast<float>(r & 0xffffu) / 65536.0f);
      const float hi = scale_lo * (1.0f + static_cast<float>(r >> 16) / 65536.0f);
      out = static_cast<uint32_t>(FloatToBf16(lo)) | static_cast<uint32_t>(FloatToBf16(hi)) << 16;
    }
    reinterpret_cast<uint32_t*>(p)[w] = out;
  }
}

bool Fp8LayerOk(const PagedKvLayer& c) {
  return c.k8 != nullptr && c.v8 != nullptr && c.head_dim == kD && c.kv_heads > 0 &&
         c.block_size > 0 && c.num_blocks >= 0 && c.fp8_block_bytes % 16 == 0 &&
         c.fp8_block_bytes >= static_cast<long long>(c.kv_heads) * c.block_size * (c.head_dim + 2);
}

}  // namespace

cudaError_t LaunchKvQuantize(const uint16_t* k, const uint16_t* v, const int32_t* slots, int tokens,
                             const PagedKvLayer& cache, cudaStream_t stream) {
  if (k == nullptr || v == nullptr || slots == nullptr || tokens < 0 || !Fp8LayerOk(cache))
    return cudaErrorInvalidValue;
  if (tokens == 0) return cudaSuccess;
  const int warps = tokens * cache.kv_heads;
  const int blocks = (warps + kWarpsPerBlock - 1) / kWarpsPerBlock;
  KvQuantizeKernel<<<blocks, 32 * kWarpsPerBlock, 0, stream>>>(
      k, v, slots, tokens, cache.kv_heads, cache.block_size,
      static_cast<long long>(cache.num_blocks) * cache.block_size, cache.k8, cache.v8,
      cache.fp8_block_bytes);
  return cudaGetLastError();
}

cudaError_t LaunchFillKvFp8(const PagedKvLayer& cache, uint64_t seed, float scale_lo,
                            cudaStream_t stream) {
  if (!Fp8LayerOk(cache)) return cudaErrorInvalidValue;
  if (cache.num_blocks == 0) return cudaSuccess;
  const long long codes = static_cast<long long>(cache.kv_heads) * cache.block_size * kD;
  const long long used = codes + static_cast<long long>(cache.kv_heads) * cache.block_size * 2;
  for (int i = 0; i < 2; ++i) {
    FillKvFp8Kernel<<<1024, 256, 0, stream>>>(i == 0 ? cache.k8 : cache.v8, cache.num_blocks,
                                              cache.fp8_block_bytes, codes, used, seed + i,
                                              scale_lo);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

}  // namespace flotilla::kernels::cuda
