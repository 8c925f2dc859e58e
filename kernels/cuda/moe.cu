#include <cuda_bf16.h>

#include <algorithm>

#include "kernels/cuda/moe.h"

namespace flotilla::kernels::cuda {
namespace {

constexpr int kThreads = 256;  // 8 warps per block in the GEMV kernels
constexpr int kWarps = kThreads / 32;
constexpr int kMaxBlocksPerLane = 4;  // rows of up to 4 * 32 * 32 = 4096 inputs
constexpr int kMaxExperts = 1024;     // routing keeps per-expert counters in shared memory
constexpr int kRouteThreads = 1024;

// Decoding trick: the 3 magnitude bits (e1 e0 m) of a nibble placed at f32 bits
// 24..22 and its sign at bit 31 make exactly fp4 * 2^-126 (0.5 lands on the
// subnormal 2^-127; no flush-to-zero is used). Activations are pre-multiplied by
// 2^64, so every product is fp4 * x * 2^-62: exact, and a normal number for any
// |fp4 * x| >= 2^-64. The row sum is multiplied back by 2^62 at the end.
constexpr float kActivationPrescale = 18446744073709551616.0f;  // 2^64
constexpr float kResultRescale = 4611686018427387904.0f;        // 2^62

template <int kNibble>
__device__ __forceinline__ float Fp4Times2PowMinus126(uint32_t w) {
  constexpr int kMagShift = 22 - 4 * kNibble;
  uint32_t mag = (kMagShift >= 0 ? (w << (kMagShift >= 0 ? kMagShift : 0))
                                 : (w >> (kMagShift < 0 ? -kMagShift : 0))) &
                 0x01C00000u;
  uint32_t sign = (w << (28 - 4 * kNibble)) & 0x80000000u;
  return __uint_as_float(mag | sign);
}

// 2^(s - 127) from the exponent bits; s = 0 is the subnormal 2^-127.
__device__ __forceinline__ float ScaleValue(uint32_t s) {
  return __uint_as_float(s != 0 ? (s << 23) : 0x00400000u);
}

__device__ __forceinline__ float Bf16Bits(uint16_t b) {
  return __uint_as_float(static_cast<uint32_t>(b) << 16);
}

// Activations of up to kTok tokens staged in shared memory, f32, pre-multiplied
// by 2^64. Each 32-value block takes kXStride floats: the 4 extra floats keep
// the lanes' 16-byte reads (lane i reads block i) free of bank conflicts.
constexpr int kTok = 4;
constexpr int kRows = 4;  // weight rows per warp; their loads stay in registers
constexpr int kXStride = 36;
constexpr int kRowsPerBlock = kWarps * kRows;

__device__ __forceinline__ float ToF32(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float ToF32(float v) { return v; }

template <typename TIn>
__device__ __forceinline__ void StageActivations(const TIn* src, int ncols, float* xs) {
  for (int c = threadIdx.x; c < ncols; c += blockDim.x) {
    xs[(c >> 5) * kXStride + (c & 31)] = ToF32(src[c]) * kActivationPrescale;
  }
}

struct RouteView {
  const int32_t* offset;   // [E + 1]
  const int32_t* pair_of;  // [P]
  const int32_t* active;   // [E]
  const int32_t* num_active;
};

// The grouped GEMV shared by both projections. Block (x, slot) owns weight rows
// [x * kRowsPerBlock, +kRowsPerBlock) of the slot's expert; each warp holds its
// kRows rows' 16-byte blocks and scales in registers (loaded once, before the
// activations arrive) and sweeps over the expert's tokens kTok at a time, so a
// weight byte leaves HBM once per call whatever the number of tokens.
// Epilogue(row0, tok, sums) runs in every lane with the warp-reduced sums
// sums[r][t] of rows row0 + r for tokens tok[t] (t < ntok).
template <typename TIn, typename Epilogue>
__device__ __forceinline__ void GroupedGemv(const uint8_t* blocks, const uint8_t* scales, int rows,
                                            int ncols, const TIn* act, const RouteView& route,
                                            int top_k, bool act_per_pair, float* xs,
                                            Epilogue epilogue) {
  const int slot = blockIdx.y;
  if (slot >= *route.num_active) return;
  const int e = route.active[slot];
  const int begin = route.offset[e], end = route.offset[e + 1];
  const int nb = ncols / 32;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int row0 = blockIdx.x * kRowsPerBlock + warp * kRows;
  const size_t expert_rows = static_cast<size_t>(e) * rows;

  const int lane_blocks = (nb + 31) / 32;  // the 16-byte blocks each lane owns per row
  // Loads the lane's block `b` of the warp's rows (zeros past the row ends).
  auto load = [&](int b, uint4(&wv)[kRows], uint32_t(&sv)[kRows]) {
    const int blk = lane + 32 * b;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const bool ok = b < lane_blocks && blk < nb && row0 + r < rows;
      const size_t idx = (expert_rows + row0 + r) * nb + blk;
      wv[r] = ok ? __ldg(reinterpret_cast<const uint4*>(blocks) + idx) : make_uint4(0, 0, 0, 0);
      sv[r] = ok ? __ldg(scales + idx) : 127u;
    }
  };

  for (int c = begin; c < end; c += kTok) {
    const int ntok = min(kTok, end - c);
    // The first weight loads go out before the activations are staged.
    uint4 wv[kRows];
    uint32_t sv[kRows];
    load(0, wv, sv);
    __syncthreads();  // the previous chunk's readers are done with xs
    for (int t = 0; t < ntok; ++t) {
      const int pair = route.pair_of[c + t];
      const size_t src_row = act_per_pair ? pair : pair / top_k;
      StageActivations(act + src_row * ncols, ncols, xs + t * nb * kXStride);
    }
    __syncthreads();
    if (row0 >= rows) continue;

    float acc[kRows][kTok] = {};
#pragma unroll 1
    for (int b = 0; b < lane_blocks; ++b) {
      uint4 next_wv[kRows];
      uint32_t next_sv[kRows];
      load(b + 1, next_wv, next_sv);  // in flight while block b is decoded
      const int blk = lane + 32 * b;
      if (blk < nb) {
        float part[kRows][kTok] = {};
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          float xv[kTok][8];
#pragma unroll
          for (int t = 0; t < kTok; ++t) {
            if (t < ntok) {
              const float4* p =
                  reinterpret_cast<const float4*>(xs + t * nb * kXStride + blk * kXStride + q * 8);
              float4 x0 = p[0], x1 = p[1];
              xv[t][0] = x0.x, xv[t][1] = x0.y, xv[t][2] = x0.z, xv[t][3] = x0.w;
              xv[t][4] = x1.x, xv[t][5] = x1.y, xv[t][6] = x1.z, xv[t][7] = x1.w;
            } else {
#pragma unroll
              for (int i = 0; i < 8; ++i) xv[t][i] = 0.f;
            }
          }
#pragma unroll
          for (int r = 0; r < kRows; ++r) {
            const uint32_t w = q == 0 ? wv[r].x : q == 1 ? wv[r].y : q == 2 ? wv[r].z : wv[r].w;
            float v[8];
            v[0] = Fp4Times2PowMinus126<0>(w), v[1] = Fp4Times2PowMinus126<1>(w);
            v[2] = Fp4Times2PowMinus126<2>(w), v[3] = Fp4Times2PowMinus126<3>(w);
            v[4] = Fp4Times2PowMinus126<4>(w), v[5] = Fp4Times2PowMinus126<5>(w);
            v[6] = Fp4Times2PowMinus126<6>(w), v[7] = Fp4Times2PowMinus126<7>(w);
#pragma unroll
            for (int t = 0; t < kTok; ++t) {
#pragma unroll
              for (int i = 0; i < 8; ++i) part[r][t] = fmaf(v[i], xv[t][i], part[r][t]);
            }
          }
        }
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          const float s = ScaleValue(sv[r]);
#pragma unroll
          for (int t = 0; t < kTok; ++t) acc[r][t] = fmaf(part[r][t], s, acc[r][t]);
        }
      }
#pragma unroll
      for (int r = 0; r < kRows; ++r) wv[r] = next_wv[r], sv[r] = next_sv[r];
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
#pragma unroll
      for (int t = 0; t < kTok; ++t) {
        float a = acc[r][t];
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) a += __shfl_xor_sync(0xFFFFFFFFu, a, off);
        acc[r][t] = a * kResultRescale;
      }
    }
    epilogue(row0, c, ntok, lane, acc);
  }
}

__global__ void __launch_bounds__(kThreads, 2)
    GateUpSwigluKernel(MoeDeviceWeights w, const __nv_bfloat16* x, int top_k, RouteView route,
                       float limit, float alpha, float* h) {
  extern __shared__ float4 smem[];
  const int I = w.intermediate;
  const uint16_t* bias_all = w.gate_up_bias;
  const int e = blockIdx.y < *route.num_active ? route.active[blockIdx.y] : 0;
  const uint16_t* bias = bias_all + static_cast<size_t>(e) * 2 * I;
  // Rows come in interleaved gate/up pairs: rows row0 + 2o, row0 + 2o + 1 make
  // output (row0 / 2 + o). Lane t * 2 + o writes token t's output o.
  auto epilogue = [&](int row0, int c, int ntok, int lane, const float(&s)[kRows][kTok]) {
#pragma unroll
    for (int t = 0; t < kTok; ++t) {
#pragma unroll
      for (int o = 0; o < kRows / 2; ++o) {
        const int j = row0 / 2 + o;
        if (lane == t * (kRows / 2) + o && t < ntok && j < I) {
          float gate = s[2 * o][t] + Bf16Bits(bias[2 * j]);
          float up = s[2 * o + 1][t] + Bf16Bits(bias[2 * j + 1]);
          gate = fminf(gate, limit);
          up = fminf(fmaxf(up, -limit), limit);
          const float glu = gate * (1.0f / (1.0f + expf(-(gate * alpha))));
          h[static_cast<size_t>(route.pair_of[c + t]) * I + j] = (up + 1.0f) * glu;
        }
      }
    }
  };
  GroupedGemv(w.gate_up_blocks, w.gate_up_scales, 2 * I, w.hidden, x, route, top_k,
              /*act_per_pair=*/false, reinterpret_cast<float*>(smem), epilogue);
}

__global__ void __launch_bounds__(kThreads, 2)
    DownScatterKernel(MoeDeviceWeights w, const float* h, const float* topk_weights, int top_k,
                      RouteView route, float* out) {
  extern __shared__ float4 smem[];
  const int H = w.hidden;
  const int e = blockIdx.y < *route.num_active ? route.active[blockIdx.y] : 0;
  const uint16_t* bias = w.down_bias + static_cast<size_t>(e) * H;
  // Lane r * kTok + t adds token t's row r, weighted, into the output.
  auto epilogue = [&](int row0, int c, int ntok, int lane, const float(&s)[kRows][kTok]) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
#pragma unroll
      for (int t = 0; t < kTok; ++t) {
        if (lane == r * kTok + t && t < ntok && row0 + r < H) {
          const int pair = route.pair_of[c + t];
          atomicAdd(out + static_cast<size_t>(pair / top_k) * H + row0 + r,
                    topk_weights[pair] * (s[r][t] + Bf16Bits(bias[row0 + r])));
        }
      }
    }
  };
  GroupedGemv(w.down_blocks, w.down_scales, H, w.intermediate, h, route, top_k,
              /*act_per_pair=*/true, reinterpret_cast<float*>(smem), epilogue);
}

// One block groups all pairs: counts in shared memory, a serial scan over the
// experts (E <= 1024), then each pair takes a slot in its expert's range.
__global__ void __launch_bounds__(kRouteThreads)
    RouteKernel(const int32_t* ids, int pairs, int num_experts, int32_t* count, int32_t* offset,
                int32_t* pair_of, int32_t* active, int32_t* num_active, int32_t* invalid) {
  __shared__ int32_t s_count[kMaxExperts];
  __shared__ int32_t s_cursor[kMaxExperts];
  __shared__ int32_t s_invalid;
  for (int e = threadIdx.x; e < num_experts; e += blockDim.x) s_count[e] = 0;
  if (threadIdx.x == 0) s_invalid = 0;
  __syncthreads();
  for (int p = threadIdx.x; p < pairs; p += blockDim.x) {
    int e = ids[p];
    if (e >= 0 && e < num_experts) {
      atomicAdd(&s_count[e], 1);
    } else {
      atomicAdd(&s_invalid, 1);
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int run = 0, n = 0;
    for (int e = 0; e < num_experts; ++e) {
      s_cursor[e] = run;
      offset[e] = run;
      count[e] = s_count[e];
      if (s_count[e] > 0) active[n++] = e;
      run += s_count[e];
    }
    offset[num_experts] = run;
    *num_active = n;
    if (invalid != nullptr) *invalid = s_invalid;
  }
  __syncthreads();
  for (int p = threadIdx.x; p < pairs; p += blockDim.x) {
    int e = ids[p];
    if (e >= 0 && e < num_experts) pair_of[atomicAdd(&s_cursor[e], 1)] = p;
  }
}

__device__ __forceinline__ uint64_t SplitMix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

enum FillKind { kFillBytes = 0, kFillScales = 1, kFillBias = 2 };

__global__ void FillKernel(uint8_t* dst, size_t n, uint64_t seed, int kind) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    uint64_t r = SplitMix64(seed ^ SplitMix64(i));
    if (kind == kFillBytes) {
      dst[i] = static_cast<uint8_t>(r);
    } else if (kind == kFillScales) {
      dst[i] = static_cast<uint8_t>(117 + r % 6);  // 2^-10 .. 2^-5
    } else {
      float u = static_cast<float>(r >> 40) * (1.0f / 16777216.0f);  // [0, 1)
      __nv_bfloat16 b = __float2bfloat16_rn(0.2f * u - 0.1f);
      reinterpret_cast<uint16_t*>(dst)[i] = *reinterpret_cast<uint16_t*>(&b);
    }
  }
}

cudaError_t Fill(void* dst, size_t n, uint64_t seed, int kind, cudaStream_t stream) {
  size_t blocks = std::min<size_t>((n + kThreads - 1) / kThreads, 4096);
  FillKernel<<<static_cast<unsigned>(std::max<size_t>(blocks, 1)), kThreads, 0, stream>>>(
      static_cast<uint8_t*>(dst), n, seed, kind);
  return cudaGetLastError();
}

bool ShapeOk(int num_experts, int hidden, int intermediate) {
  return num_experts > 0 && num_experts <= kMaxExperts && hidden > 0 && intermediate > 0 &&
         hidden % 32 == 0 && intermediate % 32 == 0 && hidden <= 32 * 32 * kMaxBlocksPerLane &&
         intermediate <= 32 * 32 * kMaxBlocksPerLane;
}

size_t AlignUp(size_t v) { return (v + 255) & ~size_t{255}; }

struct Sizes {
  size_t gu_blocks, gu_scales, gu_bias, d_blocks, d_scales, d_bias;
};

Sizes SizesOf(int E, int H, int I) {
  size_t e = static_cast<size_t>(E);
  size_t h = static_cast<size_t>(H), i = static_cast<size_t>(I);
  return {e * 2 * i * (h / 32) * 16, e * 2 * i * (h / 32), e * 2 * i * 2,
          e * h * (i / 32) * 16,     e * h * (i / 32),     e * h * 2};
}

size_t StagingBytes(int ncols) { return size_t{kTok} * (ncols / 32) * kXStride * sizeof(float); }

template <typename Kernel>
cudaError_t AllowSharedBytes(Kernel kernel, size_t bytes) {
  if (bytes <= 48 * 1024) return cudaSuccess;
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              static_cast<int>(bytes));
}

cudaError_t LaunchGateUp(dim3 grid, cudaStream_t stream, MoeDeviceWeights w, const __nv_bfloat16* x,
                         int top_k, RouteView route, float limit, float alpha, float* h) {
  const size_t smem = StagingBytes(w.hidden);
  cudaError_t err = AllowSharedBytes(GateUpSwigluKernel, smem);
  if (err != cudaSuccess) return err;
  GateUpSwigluKernel<<<grid, kThreads, smem, stream>>>(w, x, top_k, route, limit, alpha, h);
  return cudaGetLastError();
}

cudaError_t LaunchDown(dim3 grid, cudaStream_t stream, MoeDeviceWeights w, const float* h,
                       const float* topk_weights, int top_k, RouteView route, float* out) {
  const size_t smem = StagingBytes(w.intermediate);
  cudaError_t err = AllowSharedBytes(DownScatterKernel, smem);
  if (err != cudaSuccess) return err;
  DownScatterKernel<<<grid, kThreads, smem, stream>>>(w, h, topk_weights, top_k, route, out);
  return cudaGetLastError();
}

}  // namespace

size_t MoeDeviceWeights::ExpertBytes() const {
  if (num_experts <= 0) return 0;
  Sizes s = SizesOf(num_experts, hidden, intermediate);
  return (s.gu_blocks + s.gu_scales + s.gu_bias + s.d_blocks + s.d_scales + s.d_bias) /
         static_cast<size_t>(num_experts);
}

cudaError_t AllocMoeWeights(int num_experts, int hidden, int intermediate, MoeDeviceWeights* w) {
  if (w == nullptr || !ShapeOk(num_experts, hidden, intermediate)) return cudaErrorInvalidValue;
  *w = MoeDeviceWeights{};
  w->num_experts = num_experts;
  w->hidden = hidden;
  w->intermediate = intermediate;
  Sizes s = SizesOf(num_experts, hidden, intermediate);
  cudaError_t err = cudaSuccess;
  auto alloc = [&err](auto** p, size_t bytes) {
    if (err == cudaSuccess) err = cudaMalloc(reinterpret_cast<void**>(p), bytes);
  };
  alloc(&w->gate_up_blocks, s.gu_blocks);
  alloc(&w->gate_up_scales, s.gu_scales);
  alloc(&w->gate_up_bias, s.gu_bias);
  alloc(&w->down_blocks, s.d_blocks);
  alloc(&w->down_scales, s.d_scales);
  alloc(&w->down_bias, s.d_bias);
  if (err != cudaSuccess) FreeMoeWeights(w);
  return err;
}

void FreeMoeWeights(MoeDeviceWeights* w) {
  if (w == nullptr) return;
  cudaFree(w->gate_up_blocks);
  cudaFree(w->gate_up_scales);
  cudaFree(w->gate_up_bias);
  cudaFree(w->down_blocks);
  cudaFree(w->down_scales);
  cudaFree(w->down_bias);
  *w = MoeDeviceWeights{};
}

cudaError_t UploadMoeExpert(const MoeDeviceWeights& w, int slot, const uint8_t* gate_up_blocks,
                            const uint8_t* gate_up_scales, const uint16_t* gate_up_bias,
                            const uint8_t* down_blocks, const uint8_t* down_scales,
                            const uint16_t* down_bias, cudaStream_t stream) {
  if (slot < 0 || slot >= w.num_experts || gate_up_blocks == nullptr || gate_up_scales == nullptr ||
      gate_up_bias == nullptr || down_blocks == nullptr || down_scales == nullptr ||
      down_bias == nullptr) {
    return cudaErrorInvalidValue;
  }
  Sizes s = SizesOf(1, w.hidden, w.intermediate);
  size_t e = static_cast<size_t>(slot);
  struct Copy {
    void* dst;
    const void* src;
    size_t bytes;
  } copies[] = {
      {w.gate_up_blocks + e * s.gu_blocks, gate_up_blocks, s.gu_blocks},
      {w.gate_up_scales + e * s.gu_scales, gate_up_scales, s.gu_scales},
      {reinterpret_cast<uint8_t*>(w.gate_up_bias) + e * s.gu_bias, gate_up_bias, s.gu_bias},
      {w.down_blocks + e * s.d_blocks, down_blocks, s.d_blocks},
      {w.down_scales + e * s.d_scales, down_scales, s.d_scales},
      {reinterpret_cast<uint8_t*>(w.down_bias) + e * s.d_bias, down_bias, s.d_bias},
  };
  for (const Copy& c : copies) {
    cudaError_t err = cudaMemcpyAsync(c.dst, c.src, c.bytes, cudaMemcpyHostToDevice, stream);
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

cudaError_t LaunchFillMoeWeightsSynthetic(const MoeDeviceWeights& w, uint64_t seed,
                                          cudaStream_t stream) {
  if (!ShapeOk(w.num_experts, w.hidden, w.intermediate)) return cudaErrorInvalidValue;
  Sizes s = SizesOf(w.num_experts, w.hidden, w.intermediate);
  cudaError_t err;
  if ((err = Fill(w.gate_up_blocks, s.gu_blocks, seed * 6 + 0, kFillBytes, stream))) return err;
  if ((err = Fill(w.gate_up_scales, s.gu_scales, seed * 6 + 1, kFillScales, stream))) return err;
  if ((err = Fill(w.gate_up_bias, s.gu_bias / 2, seed * 6 + 2, kFillBias, stream))) return err;
  if ((err = Fill(w.down_blocks, s.d_blocks, seed * 6 + 3, kFillBytes, stream))) return err;
  if ((err = Fill(w.down_scales, s.d_scales, seed * 6 + 4, kFillScales, stream))) return err;
  return Fill(w.down_bias, s.d_bias / 2, seed * 6 + 5, kFillBias, stream);
}

size_t MoeWorkspaceBytes(const MoeDeviceWeights& w, int tokens, int top_k) {
  if (tokens <= 0 || top_k <= 0) return 0;
  size_t pairs = static_cast<size_t>(tokens) * top_k;
  size_t e = static_cast<size_t>(w.num_experts);
  return AlignUp((3 * e + 3) * sizeof(int32_t)) + AlignUp(pairs * sizeof(int32_t)) +
         AlignUp(pairs * static_cast<size_t>(w.intermediate) * sizeof(float));
}

cudaError_t LaunchMoeRoute(const int32_t* topk_ids, int pairs, int num_experts,
                           int32_t* expert_count, int32_t* expert_offset, int32_t* pair_of,
                           int32_t* active, int32_t* num_active, int32_t* invalid_ids,
                           cudaStream_t stream) {
  if (pairs < 0 || num_experts <= 0 || num_experts > kMaxExperts ||
      (pairs > 0 && (topk_ids == nullptr || pair_of == nullptr)) || expert_count == nullptr ||
      expert_offset == nullptr || active == nullptr || num_active == nullptr) {
    return cudaErrorInvalidValue;
  }
  RouteKernel<<<1, kRouteThreads, 0, stream>>>(topk_ids, pairs, num_experts, expert_count,
                                               expert_offset, pair_of, active, num_active,
                                               invalid_ids);
  return cudaGetLastError();
}

cudaError_t LaunchMoeLayer(const MoeDeviceWeights& w, const uint16_t* x, const int32_t* topk_ids,
                           const float* topk_weights, int tokens, int top_k, float limit,
                           float alpha, float* out, void* workspace, size_t workspace_bytes,
                           int32_t* invalid_ids, cudaStream_t stream) {
  if (!ShapeOk(w.num_experts, w.hidden, w.intermediate) || tokens < 0 || top_k <= 0 ||
      top_k > w.num_experts) {
    return cudaErrorInvalidValue;
  }
  if (tokens == 0) return cudaSuccess;
  if (x == nullptr || topk_ids == nullptr || topk_weights == nullptr || out == nullptr ||
      workspace == nullptr || workspace_bytes < MoeWorkspaceBytes(w, tokens, top_k) ||
      reinterpret_cast<uintptr_t>(workspace) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(x) % 16 != 0 || reinterpret_cast<uintptr_t>(out) % 16 != 0 ||
      static_cast<int64_t>(tokens) * top_k > (int64_t{1} << 30)) {
    return cudaErrorInvalidValue;
  }
  const int E = w.num_experts, pairs = tokens * top_k;
  auto* base = static_cast<uint8_t*>(workspace);
  int32_t* count = reinterpret_cast<int32_t*>(base);
  int32_t* offset = count + E;
  int32_t* active = offset + E + 1;
  int32_t* num_active = active + E;
  base += AlignUp((3 * static_cast<size_t>(E) + 3) * sizeof(int32_t));
  int32_t* pair_of = reinterpret_cast<int32_t*>(base);
  base += AlignUp(static_cast<size_t>(pairs) * sizeof(int32_t));
  float* h = reinterpret_cast<float*>(base);

  cudaError_t err = LaunchMoeRoute(topk_ids, pairs, E, count, offset, pair_of, active, num_active,
                                   invalid_ids, stream);
  if (err != cudaSuccess) return err;
  RouteView route{offset, pair_of, active, num_active};
  // At most min(E, pairs) experts are touched: that bounds the grid's second axis.
  const unsigned slots = static_cast<unsigned>(std::min(E, pairs));
  const int H = w.hidden, I = w.intermediate;
  dim3 gu_grid((2 * I + kRowsPerBlock - 1) / kRowsPerBlock, slots);
  err = LaunchGateUp(gu_grid, stream, w, reinterpret_cast<const __nv_bfloat16*>(x), top_k, route,
                     limit, alpha, h);
  if (err != cudaSuccess) return err;
  dim3 down_grid((H + kRowsPerBlock - 1) / kRowsPerBlock, slots);
  return LaunchDown(down_grid, stream, w, static_cast<const float*>(h), topk_weights, top_k, route,
                    out);
}

}  // namespace flotilla::kernels::cuda
