#include <cuda_bf16.h>

#include <cfloat>

#include "kernels/cpu/kv_fp8.h"
#include "kernels/cuda/attention_generic.h"

namespace flotilla::kernels::cuda {
namespace {

constexpr int kThreads = 64;

__device__ __forceinline__ float Bf16ToF32(uint16_t v) {
  return __uint_as_float(static_cast<uint32_t>(v) << 16);
}

__device__ __forceinline__ uint16_t F32ToBf16(float f) {
  __nv_bfloat16 b = __float2bfloat16(f);
  return *reinterpret_cast<uint16_t*>(&b);
}

// Key or value row of a (block, kv head, slot) of the cache, read as f32:
// bf16, or an FP8 layer's code times its position's scale.
template <int D, bool FP8>
struct KvRow {
  const uint16_t* bf16 = nullptr;
  const uint8_t* codes = nullptr;
  float scale = 1.0f;
  __device__ KvRow(const PagedKvLayer& c, const uint16_t* base, const uint8_t* base8, int block,
                   int kvh, int slot) {
    const size_t at = (static_cast<size_t>(kvh) * c.block_size + slot) * D;
    if constexpr (FP8) {
      const uint8_t* blk = base8 + static_cast<size_t>(block) * c.fp8_block_bytes;
      codes = blk + at;
      const size_t scale_at = static_cast<size_t>(c.kv_heads) * c.block_size * D +
                              (static_cast<size_t>(kvh) * c.block_size + slot) * sizeof(uint16_t);
      scale = Bf16ToF32(*reinterpret_cast<const uint16_t*>(blk + scale_at));
    } else {
      bf16 = base + static_cast<size_t>(block) * c.kv_heads * c.block_size * D + at;
    }
  }
  __device__ float operator[](int d) const {
    if constexpr (FP8) return cpu::E4m3ToFloat(codes[d]) * scale;
    return Bf16ToF32(bf16[d]);
  }
};

template <int D, bool FP8>
__global__ void __launch_bounds__(kThreads)
    AttentionGenericKernel(const uint16_t* __restrict__ q, PagedKvLayer cache, AttentionBatch batch,
                           int q_heads, const float* __restrict__ sinks, int window, float scale,
                           uint16_t* __restrict__ out) {
  __shared__ float q_s[D];
  __shared__ float m_s[kThreads];
  __shared__ float l_s[kThreads];
  __shared__ float acc_s[kThreads][D + 1];

  const int qi = blockIdx.x;
  const int h = blockIdx.y;
  const int tid = threadIdx.x;
  // The sequence of this query token: the last b with q_start[b] <= qi.
  int lo_b = 0, hi_b = batch.batch - 1;
  while (lo_b < hi_b) {
    const int mid = (lo_b + hi_b + 1) / 2;
    if (batch.q_start[mid] <= qi) lo_b = mid; else hi_b = mid - 1;
  }
  const int b = lo_b;
  const int n_b = batch.q_start[b + 1] - batch.q_start[b];
  const int len = batch.seq_lens[b];
  const int p = len - n_b + (qi - batch.q_start[b]);
  const int first = window > 0 ? max(0, p - window + 1) : 0;
  const int kvh = h / (q_heads / cache.kv_heads);
  const int32_t* table = batch.block_tables + static_cast<size_t>(b) * batch.max_blocks_per_seq;

  for (int d = tid; d < D; d += kThreads) {
    q_s[d] = Bf16ToF32(q[(static_cast<size_t>(qi) * q_heads + h) * D + d]);
  }
  __syncthreads();

  float m = -FLT_MAX, l = 0.0f;
  float acc[D];
#pragma unroll
  for (int d = 0; d < D; ++d) acc[d] = 0.0f;
  for (int j = first + tid; j <= p; j += kThreads) {
    const int block = table[j / cache.block_size];
    const KvRow<D, FP8> k(cache, cache.k, cache.k8, block, kvh, j % cache.block_size);
    const KvRow<D, FP8> v(cache, cache.v, cache.v8, block, kvh, j % cache.block_size);
    float s = 0.0f;
#pragma unroll
    for (int d = 0; d < D; ++d) s += q_s[d] * k[d];
    s *= scale;
    const float m_new = fmaxf(m, s);
    const float c = __expf(m - m_new);
    const float e = __expf(s - m_new);
    l = l * c + e;
#pragma unroll
    for (int d = 0; d < D; ++d) acc[d] = acc[d] * c + e * v[d];
    m = m_new;
  }
  m_s[tid] = m;
  l_s[tid] = l;
#pragma unroll
  for (int d = 0; d < D; ++d) acc_s[tid][d] = acc[d];
  __syncthreads();

  float big = sinks[h];
  for (int t = 0; t < kThreads; ++t) big = fmaxf(big, m_s[t]);
  float total = __expf(sinks[h] - big);
  for (int t = 0; t < kThreads; ++t) {
    if (l_s[t] > 0.0f) total += l_s[t] * __expf(m_s[t] - big);
  }
  for (int d = tid; d < D; d += kThreads) {
    float o = 0.0f;
    for (int t = 0; t < kThreads; ++t) {
      if (l_s[t] > 0.0f) o += acc_s[t][d] * __expf(m_s[t] - big);
    }
    out[(static_cast<size_t>(qi) * q_heads + h) * D + d] = F32ToBf16(o / total);
  }
}

template <bool FP8>
cudaError_t LaunchGeneric(const uint16_t* q, const PagedKvLayer& cache, const AttentionBatch& batch,
                          int q_heads, const float* sinks, int window, float scale, uint16_t* out,
                          cudaStream_t stream) {
  const dim3 grid(batch.total_q, q_heads);
  switch (cache.head_dim) {
    case 16:
      AttentionGenericKernel<16, FP8>
          <<<grid, kThreads, 0, stream>>>(q, cache, batch, q_heads, sinks, window, scale, out);
      break;
    case 32:
      AttentionGenericKernel<32, FP8>
          <<<grid, kThreads, 0, stream>>>(q, cache, batch, q_heads, sinks, window, scale, out);
      break;
    case 64:
      AttentionGenericKernel<64, FP8>
          <<<grid, kThreads, 0, stream>>>(q, cache, batch, q_heads, sinks, window, scale, out);
      break;
    case 128:
      AttentionGenericKernel<128, FP8>
          <<<grid, kThreads, 0, stream>>>(q, cache, batch, q_heads, sinks, window, scale, out);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

// The layer's K and V arrays are set (for FP8, with room for the scales).
bool KvArraysOk(const PagedKvLayer& c) {
  if (!c.fp8()) return c.k != nullptr && c.v != nullptr;
  return c.v8 != nullptr &&
         c.fp8_block_bytes >= static_cast<long long>(c.kv_heads) * c.block_size * (c.head_dim + 2);
}

}  // namespace

cudaError_t LaunchAttentionGeneric(const uint16_t* q, const PagedKvLayer& cache,
                                   const AttentionBatch& batch, int q_heads, const float* sinks,
                                   int window, float scale, uint16_t* out, cudaStream_t stream) {
  if (q == nullptr || out == nullptr || sinks == nullptr || !KvArraysOk(cache) ||
      batch.block_tables == nullptr || batch.seq_lens == nullptr || batch.q_start == nullptr ||
      batch.batch <= 0 || batch.total_q < 0 || q_heads <= 0 || cache.kv_heads <= 0 ||
      q_heads % cache.kv_heads != 0 || cache.block_size <= 0 || window < 0) {
    return cudaErrorInvalidValue;
  }
  if (batch.total_q == 0) return cudaSuccess;
  return cache.fp8()
             ? LaunchGeneric<true>(q, cache, batch, q_heads, sinks, window, scale, out, stream)
             : LaunchGeneric<false>(q, cache, batch, q_heads, sinks, window, scale, out, stream);
}

}  // namespace flotilla::kernels::cuda
