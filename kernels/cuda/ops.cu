// CUDA dense ops: embedding, residual add + RMSNorm, RoPE fused with the paged
// KV write, router top-K. The projections (LaunchLinear) are in linear.cu.
#include <cuda_bf16.h>

#include <algorithm>
#include <cfloat>
#include <climits>

#include "kernels/cuda/ops.h"
#include "kernels/cuda/topk.cuh"

namespace flotilla::kernels::cuda {
namespace {

__device__ __forceinline__ float Bf16Bits(uint16_t b) {
  return __uint_as_float(static_cast<uint32_t>(b) << 16);
}

__device__ __forceinline__ uint16_t ToBf16Bits(float v) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(v));
}

// bf16x2 of (lo, hi), each rounded to nearest even.
__device__ __forceinline__ uint32_t PackBf16Pair(float lo, float hi) {
  return ToBf16Bits(lo) | static_cast<uint32_t>(ToBf16Bits(hi)) << 16;
}

// Sum over a block of kThreads threads; every thread gets the total.
template <int kThreads>
__device__ __forceinline__ float BlockSum(float v, float* scratch) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float t = 0.0f;
#pragma unroll
  for (int w = 0; w < kThreads / 32; ++w) t += scratch[w];
  __syncthreads();
  return t;
}

constexpr int kNormThreads = 256;

__global__ void EmbeddingKernel(const uint16_t* __restrict__ table, int vocab, int hidden,
                                const int32_t* __restrict__ ids, float* __restrict__ out,
                                int32_t* invalid_ids) {
  const int t = blockIdx.x;
  const int id = ids[t];
  float* o = out + static_cast<size_t>(t) * hidden;
  if (id < 0 || id >= vocab) {
    for (int c = threadIdx.x; c < hidden; c += blockDim.x) o[c] = 0.0f;
    if (threadIdx.x == 0 && invalid_ids != nullptr) atomicAdd(invalid_ids, 1);
    return;
  }
  const uint16_t* row = table + static_cast<size_t>(id) * hidden;
  for (int c = threadIdx.x; c < hidden; c += blockDim.x) o[c] = Bf16Bits(row[c]);
}

// x[t] (+= add[t]); out[t] = bf16(w * (x * inv)) exactly as the CPU RmsNorm
// orders the products. Rows of up to kNormVecMax values that are 16-byte
// aligned go four values at a time and stay in registers between the sum of
// squares and the output (H200, 2,048 rows of 2,880: 15.0 us a call before,
// when every value was loaded alone and read twice).
constexpr int kNormVecPerThread = 4;
constexpr int kNormVecMax = 4 * kNormThreads * kNormVecPerThread;

__global__ void __launch_bounds__(kNormThreads)
    AddRmsNormKernel(float* __restrict__ x, const float* __restrict__ add,
                     const uint16_t* __restrict__ weight, const int32_t* __restrict__ rows,
                     int hidden, float eps, uint16_t* __restrict__ out) {
  __shared__ float scratch[kNormThreads / 32];
  // A projection launched after this with PDL may start streaming its weights.
  asm volatile("griddepcontrol.launch_dependents;");
  const int r = rows != nullptr ? rows[blockIdx.x] : blockIdx.x;
  float* xr = x + static_cast<size_t>(r) * hidden;
  const float* ar = add != nullptr ? add + static_cast<size_t>(r) * hidden : nullptr;
  uint16_t* o = out + static_cast<size_t>(blockIdx.x) * hidden;
  const bool vectors =
      hidden % 4 == 0 && hidden <= kNormVecMax && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
      (add == nullptr || reinterpret_cast<uintptr_t>(add) % 16 == 0) &&
      reinterpret_cast<uintptr_t>(weight) % 8 == 0 && reinterpret_cast<uintptr_t>(out) % 8 == 0;
  if (vectors) {
    const int n4 = hidden / 4;
    float4 v[kNormVecPerThread];
    float ss = 0.0f;
#pragma unroll
    for (int u = 0; u < kNormVecPerThread; ++u) {
      const int i = threadIdx.x + u * kNormThreads;
      if (i >= n4) break;
      v[u] = reinterpret_cast<const float4*>(xr)[i];
      if (ar != nullptr) {
        const float4 a = reinterpret_cast<const float4*>(ar)[i];
        v[u].x += a.x, v[u].y += a.y, v[u].z += a.z, v[u].w += a.w;
        reinterpret_cast<float4*>(xr)[i] = v[u];
      }
      ss += v[u].x * v[u].x + v[u].y * v[u].y + v[u].z * v[u].z + v[u].w * v[u].w;
    }
    ss = BlockSum<kNormThreads>(ss, scratch);
    const float inv = 1.0f / sqrtf(ss / static_cast<float>(hidden) + eps);
#pragma unroll
    for (int u = 0; u < kNormVecPerThread; ++u) {
      const int i = threadIdx.x + u * kNormThreads;
      if (i >= n4) break;
      const uint2 w = reinterpret_cast<const uint2*>(weight)[i];
      auto norm = [&](uint32_t wbits, float xv) {
        return static_cast<uint32_t>(
            ToBf16Bits(__fmul_rn(Bf16Bits(static_cast<uint16_t>(wbits)), __fmul_rn(xv, inv))));
      };
      reinterpret_cast<uint2*>(o)[i] =
          make_uint2(norm(w.x & 0xFFFFu, v[u].x) | norm(w.x >> 16, v[u].y) << 16,
                     norm(w.y & 0xFFFFu, v[u].z) | norm(w.y >> 16, v[u].w) << 16);
    }
    return;
  }
  float ss = 0.0f;
  if (ar != nullptr) {
    for (int c = threadIdx.x; c < hidden; c += kNormThreads) {
      float v = xr[c] + ar[c];
      xr[c] = v;
      ss += v * v;
    }
  } else {
    for (int c = threadIdx.x; c < hidden; c += kNormThreads) {
      float v = xr[c];
      ss += v * v;
    }
  }
  ss = BlockSum<kNormThreads>(ss, scratch);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(hidden) + eps);
  for (int c = threadIdx.x; c < hidden; c += kNormThreads) {
    o[c] = ToBf16Bits(__fmul_rn(Bf16Bits(weight[c]), __fmul_rn(xr[c], inv)));
  }
}

__global__ void AddInPlaceKernel(float* __restrict__ x, const float* __restrict__ add,
                                 size_t count) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < count;
       i += stride) {
    x[i] += add[i];
  }
}

constexpr int kRopeThreads = 256;

// The rotation of pair (x1, x2) by (c, s) with every product rounded (no
// fused multiply-add), as the CPU reference computes it, so that every RoPE
// kernel gives the same bits.
__device__ __forceinline__ float RotateFirst(float x1, float x2, float c, float s) {
  return __fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, s));
}
__device__ __forceinline__ float RotateSecond(float x1, float x2, float c, float s) {
  return __fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, s));
}
// Pairs (a1, a2) of dimension j and (b1, b2) of j + 1 rotated by cs[0..1],
// sn[0..1], as bf16x2 words: x = the first halves (dimensions j, j + 1), y =
// the second halves (j + half, j + 1 + half).
__device__ __forceinline__ uint2 RotateTwoPairs(float a1, float a2, float b1, float b2,
                                                const float* cs, const float* sn) {
  return make_uint2(
      PackBf16Pair(RotateFirst(a1, a2, cs[0], sn[0]), RotateFirst(b1, b2, cs[1], sn[1])),
      PackBf16Pair(RotateSecond(a1, a2, cs[0], sn[0]), RotateSecond(b1, b2, cs[1], sn[1])));
}
constexpr int kMaxHalf = 128;  // head_dim <= 256

__global__ void __launch_bounds__(kRopeThreads)
    RopeKvWriteKernel(const float* __restrict__ qkv, const int32_t* __restrict__ positions,
                      const int32_t* __restrict__ slots, int q_heads, int kv_heads, int head_dim,
                      const float* __restrict__ inv_freq, float scaling, uint16_t* __restrict__ kc,
                      uint16_t* __restrict__ vc, int block_size, long long cache_slots,
                      bool rope_pairs, uint16_t* __restrict__ q_out) {
  __shared__ float cs[kMaxHalf], sn[kMaxHalf];
  asm volatile("griddepcontrol.launch_dependents;");
  const int t = blockIdx.x;
  const int half = head_dim / 2;
  const float pos = static_cast<float>(positions[t]);
  for (int j = threadIdx.x; j < half; j += kRopeThreads) {
    const float angle = __fmul_rn(pos, inv_freq[j]);
    cs[j] = cosf(angle) * scaling;
    sn[j] = sinf(angle) * scaling;
  }
  __syncthreads();
  const int heads = q_heads + kv_heads;
  const float* src = qkv + static_cast<size_t>(t) * (heads + kv_heads) * head_dim;
  const long long slot = slots != nullptr ? slots[t] : -1;
  const bool store = slot >= 0 && slot < cache_slots;
  const long long blk = store ? slot / block_size : 0;
  const int off = store ? static_cast<int>(slot % block_size) : 0;
  // Where head h's rotated pair (o1, o2) of dimension j goes: q, or the K cache.
  auto dst_of = [&](int h) -> uint16_t* {
    if (h < q_heads) return q_out + (static_cast<size_t>(t) * q_heads + h) * head_dim;
    return store ? kc + ((blk * kv_heads + (h - q_heads)) * block_size + off) * head_dim : nullptr;
  };
  // Two dimensions j, j + 1 per thread (vector loads and bf16x2 stores) where
  // the widths allow, one otherwise: a prefill token has 72 heads of 32 pairs.
  const bool pairs2 = head_dim % 4 == 0 && reinterpret_cast<uintptr_t>(qkv) % 16 == 0;
  if (pairs2) {
    const int half2 = half / 2;
    for (int i = threadIdx.x; i < heads * half2; i += kRopeThreads) {
      const int h = i / half2, j = 2 * (i - h * half2);
      const float* v = src + h * head_dim;
      float a1, b1, a2, b2;  // x1, x2 of dimensions j (a) and j + 1 (b)
      if (rope_pairs) {
        const float4 w = *reinterpret_cast<const float4*>(v + 2 * j);
        a1 = w.x, a2 = w.y, b1 = w.z, b2 = w.w;
      } else {
        const float2 lo = *reinterpret_cast<const float2*>(v + j);
        const float2 hi = *reinterpret_cast<const float2*>(v + j + half);
        a1 = lo.x, b1 = lo.y, a2 = hi.x, b2 = hi.y;
      }
      uint16_t* d = dst_of(h);
      if (d == nullptr) continue;
      const uint2 r = RotateTwoPairs(a1, a2, b1, b2, cs + j, sn + j);
      *reinterpret_cast<uint32_t*>(d + j) = r.x;
      *reinterpret_cast<uint32_t*>(d + j + half) = r.y;
    }
  } else {
    for (int i = threadIdx.x; i < heads * half; i += kRopeThreads) {
      const int h = i / half, j = i - h * half;
      const float* v = src + h * head_dim;
      // kRopePairs: the two halves of pair j are stored rows 2j and 2j + 1.
      const float x1 = rope_pairs ? v[2 * j] : v[j];
      const float x2 = rope_pairs ? v[2 * j + 1] : v[j + half];
      uint16_t* d = dst_of(h);
      if (d == nullptr) continue;
      d[j] = ToBf16Bits(RotateFirst(x1, x2, cs[j], sn[j]));
      d[j + half] = ToBf16Bits(RotateSecond(x1, x2, cs[j], sn[j]));
    }
  }
  if (store) {
    const float* vsrc = src + heads * head_dim;
    uint16_t* vdst = vc + (blk * kv_heads * block_size + off) * head_dim;
    for (int i = threadIdx.x; i < kv_heads * head_dim; i += kRopeThreads) {
      const int kh = i / head_dim, d = i - kh * head_dim;
      vdst[static_cast<long long>(kh) * block_size * head_dim + d] = ToBf16Bits(vsrc[i]);
    }
  }
}

// RopeKvWriteKernel's common case (head_dim 64, kRopePairs rows, qkv on 16
// bytes): a token's row is (q_heads + 2 kv_heads) * 16 float4s, each a
// thread's item: in a q or k head, rotated pairs j and j + 1 (both halves of
// each, kRopePairs), in a v head four values. Every item's load is issued
// before the token's cos/sin are computed, so the trigonometry runs while the
// row is in flight.
constexpr int kRope64Items = 6;  // per thread and pass; 80 heads take 5
__global__ void __launch_bounds__(kRopeThreads)
    RopeKvWrite64Kernel(const float4* __restrict__ qkv, const int32_t* __restrict__ positions,
                        const int32_t* __restrict__ slots, int q_heads, int kv_heads,
                        const float* __restrict__ inv_freq, float scaling,
                        uint16_t* __restrict__ kc, uint16_t* __restrict__ vc, int block_size,
                        long long cache_slots, uint16_t* __restrict__ q_out) {
  constexpr int kHeadDim = 64, kHalf = 32, kVecs = kHeadDim / 4;
  __shared__ float cs[kHalf], sn[kHalf];
  asm volatile("griddepcontrol.launch_dependents;");
  const int t = blockIdx.x;
  const int heads = q_heads + kv_heads, items = (heads + kv_heads) * kVecs;
  const float4* row = qkv + static_cast<size_t>(t) * items;
  const long long slot = slots != nullptr ? slots[t] : -1;
  const bool store = slot >= 0 && slot < cache_slots;
  const long long blk = store ? slot / block_size : 0;
  const int off = store ? static_cast<int>(slot % block_size) : 0;
  for (int base = 0; base < items; base += kRope64Items * kRopeThreads) {
    float4 v[kRope64Items];
#pragma unroll
    for (int u = 0; u < kRope64Items; ++u) {
      const int i = base + u * kRopeThreads + threadIdx.x;
      if (i < items) v[u] = row[i];
    }
    if (base == 0) {
      if (threadIdx.x < kHalf) {
        const float angle = __fmul_rn(static_cast<float>(positions[t]), inv_freq[threadIdx.x]);
        cs[threadIdx.x] = cosf(angle) * scaling;
        sn[threadIdx.x] = sinf(angle) * scaling;
      }
      __syncthreads();
    }
#pragma unroll
    for (int u = 0; u < kRope64Items; ++u) {
      const int i = base + u * kRopeThreads + threadIdx.x;
      if (i >= items) continue;
      const int h = i / kVecs, c = i % kVecs;
      if (h >= heads) {  // v: four values as they are
        if (!store) continue;
        const int kh = h - heads;
        *reinterpret_cast<uint2*>(vc + ((blk * kv_heads + kh) * block_size + off) * kHeadDim +
                                  4 * c) =
            make_uint2(PackBf16Pair(v[u].x, v[u].y), PackBf16Pair(v[u].z, v[u].w));
        continue;
      }
      uint16_t* d;
      if (h < q_heads) {
        d = q_out + (static_cast<size_t>(t) * q_heads + h) * kHeadDim;
      } else if (store) {
        d = kc + ((blk * kv_heads + (h - q_heads)) * block_size + off) * kHeadDim;
      } else {
        continue;
      }
      const int j = 2 * c;  // x1, x2 of dimensions j (a) and j + 1 (b)
      const uint2 r = RotateTwoPairs(v[u].x, v[u].y, v[u].z, v[u].w, cs + j, sn + j);
      *reinterpret_cast<uint32_t*>(d + j) = r.x;
      *reinterpret_cast<uint32_t*>(d + j + kHalf) = r.y;
    }
  }
}

__global__ void RouterTopKKernel(float* __restrict__ logits, int rows, int num_experts,
                                 int k, int32_t* __restrict__ ids, float* __restrict__ weights,
                                 bool clear) {
  const int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  if (warp >= rows) return;
  float* row = logits + static_cast<size_t>(warp) * num_experts;
  WarpTopKSoftmax(row, num_experts, k, ids + static_cast<size_t>(warp) * k,
                  weights + static_cast<size_t>(warp) * k);
  if (clear) {
    // Each lane clears the entries it read.
    for (int e = threadIdx.x & 31; e < num_experts; e += 32) row[e] = 0.0f;
  }
}

}  // namespace

cudaError_t LaunchEmbedding(const uint16_t* table, int vocab, int hidden, const int32_t* ids,
                            int tokens, float* out, int32_t* invalid_ids, cudaStream_t stream) {
  if (table == nullptr || ids == nullptr || out == nullptr || vocab <= 0 || hidden <= 0 ||
      tokens < 0) {
    return cudaErrorInvalidValue;
  }
  if (tokens == 0) return cudaSuccess;
  EmbeddingKernel<<<tokens, 256, 0, stream>>>(table, vocab, hidden, ids, out, invalid_ids);
  return cudaGetLastError();
}

cudaError_t LaunchAddRmsNorm(float* x, const float* add, const uint16_t* weight, int tokens,
                             int hidden, float eps, uint16_t* out, cudaStream_t stream) {
  if (x == nullptr || weight == nullptr || out == nullptr || tokens < 0 || hidden <= 0) {
    return cudaErrorInvalidValue;
  }
  if (tokens == 0) return cudaSuccess;
  AddRmsNormKernel<<<tokens, kNormThreads, 0, stream>>>(x, add, weight, nullptr, hidden, eps,
                                                         out);
  return cudaGetLastError();
}

cudaError_t LaunchAddInPlace(float* x, const float* add, size_t count, cudaStream_t stream) {
  if ((x == nullptr || add == nullptr) && count > 0) return cudaErrorInvalidValue;
  if (count == 0) return cudaSuccess;
  constexpr int kThreads = 256;
  const size_t blocks = std::min<size_t>((count + kThreads - 1) / kThreads, 1024);
  AddInPlaceKernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(x, add, count);
  return cudaGetLastError();
}

cudaError_t LaunchRmsNormRows(const float* x, const int32_t* rows, int count, const uint16_t* weight,
                              int hidden, float eps, uint16_t* out, cudaStream_t stream) {
  if (x == nullptr || rows == nullptr || weight == nullptr || out == nullptr || count < 0 ||
      hidden <= 0) {
    return cudaErrorInvalidValue;
  }
  if (count == 0) return cudaSuccess;
  // The kernel writes x only when `add` is given; here it is not.
  AddRmsNormKernel<<<count, kNormThreads, 0, stream>>>(const_cast<float*>(x), nullptr, weight,
                                                        rows, hidden, eps, out);
  return cudaGetLastError();
}

cudaError_t LaunchRopeKvWrite(const float* qkv, const int32_t* positions, const int32_t* slots,
                              int tokens, int q_heads, const float* inv_freq, float scaling,
                              const PagedKvLayer& cache, uint16_t* q_out, cudaStream_t stream,
                              QkvRowOrder order) {
  if (qkv == nullptr || positions == nullptr || inv_freq == nullptr || q_out == nullptr ||
      tokens < 0 || q_heads <= 0 || cache.kv_heads <= 0 || cache.head_dim <= 0 ||
      cache.head_dim % 2 != 0 || cache.head_dim / 2 > kMaxHalf) {
    return cudaErrorInvalidValue;
  }
  if (slots != nullptr && (cache.k == nullptr || cache.v == nullptr || cache.block_size <= 0 ||
                           cache.num_blocks < 0)) {
    return cudaErrorInvalidValue;
  }
  if (tokens == 0) return cudaSuccess;
  const long long cache_slots = static_cast<long long>(cache.num_blocks) * cache.block_size;
  const bool aligned = reinterpret_cast<uintptr_t>(qkv) % 16 == 0 &&
                       (slots == nullptr || reinterpret_cast<uintptr_t>(cache.v) % 8 == 0);
  if (cache.head_dim == 64 && order == QkvRowOrder::kRopePairs && aligned) {
    RopeKvWrite64Kernel<<<tokens, kRopeThreads, 0, stream>>>(
        reinterpret_cast<const float4*>(qkv), positions, slots, q_heads, cache.kv_heads, inv_freq,
        scaling, cache.k, cache.v, cache.block_size > 0 ? cache.block_size : 1, cache_slots, q_out);
    return cudaGetLastError();
  }
  RopeKvWriteKernel<<<tokens, kRopeThreads, 0, stream>>>(
      qkv, positions, slots, q_heads, cache.kv_heads, cache.head_dim, inv_freq, scaling, cache.k,
      cache.v, cache.block_size > 0 ? cache.block_size : 1, cache_slots,
      order == QkvRowOrder::kRopePairs, q_out);
  return cudaGetLastError();
}

cudaError_t LaunchRouterTopK(float* logits, int rows, int num_experts, int k, int32_t* ids,
                             float* weights, cudaStream_t stream, bool clear_logits) {
  if (logits == nullptr || ids == nullptr || weights == nullptr || rows < 0 || num_experts <= 0 ||
      num_experts > 32 * kTopKMaxPerLane || k <= 0 || k > kTopKMaxK || k > num_experts) {
    return cudaErrorInvalidValue;
  }
  if (rows == 0) return cudaSuccess;
  constexpr int kThreads = 128;  // 4 rows per block
  const int blocks = (rows + kThreads / 32 - 1) / (kThreads / 32);
  RouterTopKKernel<<<blocks, kThreads, 0, stream>>>(logits, rows, num_experts, k, ids, weights,
                                                     clear_logits);
  return cudaGetLastError();
}

}  // namespace flotilla::kernels::cuda
