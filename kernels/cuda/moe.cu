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

// Loads this lane's share of one input row (blocks lane, lane + 32, ...) into
// registers, pre-multiplied by 2^64; blocks past the row end are zero.
template <int kB>
__device__ __forceinline__ void LoadActivations(const __nv_bfloat16* row, int nb, int lane,
                                                float (&x)[kB][32]) {
#pragma unroll
  for (int b = 0; b < kB; ++b) {
    int blk = lane + 32 * b;
    if (blk < nb) {
      const uint4* p = reinterpret_cast<const uint4*>(row + blk * 32);
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        uint4 v = p[q];
        uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          x[b][q * 8 + 2 * i] = __uint_as_float(words[i] << 16) * kActivationPrescale;
          x[b][q * 8 + 2 * i + 1] = __uint_as_float(words[i] & 0xFFFF0000u) * kActivationPrescale;
        }
      }
    } else {
#pragma unroll
      for (int i = 0; i < 32; ++i) x[b][i] = 0.f;
    }
  }
}

template <int kB>
__device__ __forceinline__ void LoadActivations(const float* row, int nb, int lane,
                                                float (&x)[kB][32]) {
#pragma unroll
  for (int b = 0; b < kB; ++b) {
    int blk = lane + 32 * b;
    if (blk < nb) {
      const float4* p = reinterpret_cast<const float4*>(row + blk * 32);
#pragma unroll
      for (int q = 0; q < 8; ++q) {
        float4 v = p[q];
        x[b][4 * q] = v.x * kActivationPrescale;
        x[b][4 * q + 1] = v.y * kActivationPrescale;
        x[b][4 * q + 2] = v.z * kActivationPrescale;
        x[b][4 * q + 3] = v.w * kActivationPrescale;
      }
    } else {
#pragma unroll
      for (int i = 0; i < 32; ++i) x[b][i] = 0.f;
    }
  }
}

// Dot products of kRows consecutive MXFP4 rows (starting at `row0`, `rows` in
// all) with the lane's activations; returns the full sums in every lane.
// All 16-byte block loads and scale loads are issued before the first use.
template <int kB, int kRows>
__device__ __forceinline__ void DotRows(const uint8_t* blocks, const uint8_t* scales, int nb,
                                        int row0, int rows, int lane, const float (&x)[kB][32],
                                        float (&sum)[kRows]) {
  uint4 wv[kRows][kB];
  uint32_t sv[kRows][kB];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
#pragma unroll
    for (int b = 0; b < kB; ++b) {
      int blk = lane + 32 * b;
      bool ok = blk < nb && row0 + r < rows;
      size_t idx = static_cast<size_t>(row0 + r) * nb + blk;
      wv[r][b] = ok ? __ldg(reinterpret_cast<const uint4*>(blocks) + idx) : make_uint4(0, 0, 0, 0);
      sv[r][b] = ok ? __ldg(scales + idx) : 127u;
    }
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    float acc = 0.f;
#pragma unroll
    for (int b = 0; b < kB; ++b) {
      uint32_t words[4] = {wv[r][b].x, wv[r][b].y, wv[r][b].z, wv[r][b].w};
      float part = 0.f;
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        part = fmaf(Fp4Times2PowMinus126<0>(words[q]), x[b][q * 8 + 0], part);
        part = fmaf(Fp4Times2PowMinus126<1>(words[q]), x[b][q * 8 + 1], part);
        part = fmaf(Fp4Times2PowMinus126<2>(words[q]), x[b][q * 8 + 2], part);
        part = fmaf(Fp4Times2PowMinus126<3>(words[q]), x[b][q * 8 + 3], part);
        part = fmaf(Fp4Times2PowMinus126<4>(words[q]), x[b][q * 8 + 4], part);
        part = fmaf(Fp4Times2PowMinus126<5>(words[q]), x[b][q * 8 + 5], part);
        part = fmaf(Fp4Times2PowMinus126<6>(words[q]), x[b][q * 8 + 6], part);
        part = fmaf(Fp4Times2PowMinus126<7>(words[q]), x[b][q * 8 + 7], part);
      }
      acc = fmaf(part, ScaleValue(sv[r][b]), acc);
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xFFFFFFFFu, acc, off);
    sum[r] = acc * kResultRescale;
  }
}

struct RouteView {
  const int32_t* offset;   // [E + 1]
  const int32_t* pair_of;  // [P]
  const int32_t* active;   // [E]
  const int32_t* num_active;
};

// gate_up: block (x, slot) computes outputs [x * kOutPerBlock, +kOutPerBlock)
// of h for every pair routed to the slot's expert. A warp takes two outputs
// (four interleaved gate/up rows) per pass.
constexpr int kGateUpOutPerWarp = 2;
constexpr int kGateUpOutPerBlock = kWarps * kGateUpOutPerWarp;

template <int kB>
__global__ void __launch_bounds__(kThreads, 1)
    GateUpSwigluKernel(MoeDeviceWeights w, const __nv_bfloat16* x, int top_k, RouteView route,
                       float limit, float alpha, float* h) {
  int slot = blockIdx.y;
  if (slot >= *route.num_active) return;
  int e = route.active[slot];
  int begin = route.offset[e], end = route.offset[e + 1];
  const int H = w.hidden, I = w.intermediate, nb = H / 32;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int j0 = blockIdx.x * kGateUpOutPerBlock + warp * kGateUpOutPerWarp;
  if (j0 >= I) return;
  const uint8_t* blocks = w.gate_up_blocks + static_cast<size_t>(e) * 2 * I * nb * 16;
  const uint8_t* scales = w.gate_up_scales + static_cast<size_t>(e) * 2 * I * nb;
  const uint16_t* bias = w.gate_up_bias + static_cast<size_t>(e) * 2 * I;
  float xr[kB][32];
  for (int i = begin; i < end; ++i) {
    int pair = route.pair_of[i];
    LoadActivations<kB>(x + static_cast<size_t>(pair / top_k) * H, nb, lane, xr);
    float s[2 * kGateUpOutPerWarp];
    DotRows<kB, 2 * kGateUpOutPerWarp>(blocks, scales, nb, 2 * j0, 2 * I, lane, xr, s);
    if (lane < kGateUpOutPerWarp && j0 + lane < I) {
      int j = j0 + lane;
      float gate = lane == 0 ? s[0] : s[2];
      float up = lane == 0 ? s[1] : s[3];
      gate += Bf16Bits(bias[2 * j]);
      up += Bf16Bits(bias[2 * j + 1]);
      gate = fminf(gate, limit);
      up = fminf(fmaxf(up, -limit), limit);
      float glu = gate * (1.0f / (1.0f + expf(-(gate * alpha))));
      h[static_cast<size_t>(pair) * I + j] = (up + 1.0f) * glu;
    }
  }
}

// down: block (x, slot) computes output features [x * kDownRowsPerBlock, +...)
// for every pair of the slot's expert and adds weight * (row + bias) into out.
constexpr int kDownRowsPerWarp = 4;
constexpr int kDownRowsPerBlock = kWarps * kDownRowsPerWarp;

template <int kB>
__global__ void __launch_bounds__(kThreads, 1)
    DownScatterKernel(MoeDeviceWeights w, const float* h, const float* topk_weights, int top_k,
                      RouteView route, float* out) {
  int slot = blockIdx.y;
  if (slot >= *route.num_active) return;
  int e = route.active[slot];
  int begin = route.offset[e], end = route.offset[e + 1];
  const int H = w.hidden, I = w.intermediate, nb = I / 32;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int o0 = blockIdx.x * kDownRowsPerBlock + warp * kDownRowsPerWarp;
  if (o0 >= H) return;
  const uint8_t* blocks = w.down_blocks + static_cast<size_t>(e) * H * nb * 16;
  const uint8_t* scales = w.down_scales + static_cast<size_t>(e) * H * nb;
  const uint16_t* bias = w.down_bias + static_cast<size_t>(e) * H;
  float xr[kB][32];
  for (int i = begin; i < end; ++i) {
    int pair = route.pair_of[i];
    LoadActivations<kB>(h + static_cast<size_t>(pair) * I, nb, lane, xr);
    float s[kDownRowsPerWarp];
    DotRows<kB, kDownRowsPerWarp>(blocks, scales, nb, o0, H, lane, xr, s);
    float weight = topk_weights[pair];
    float* orow = out + static_cast<size_t>(pair / top_k) * H;
#pragma unroll
    for (int r = 0; r < kDownRowsPerWarp; ++r) {
      if (lane == r && o0 + r < H) atomicAdd(orow + o0 + r, weight * (s[r] + Bf16Bits(bias[o0 + r])));
    }
  }
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

template <template <int> class Launch, typename... Args>
cudaError_t DispatchBlocks(int blocks_per_lane, Args... args) {
  switch (blocks_per_lane) {
    case 1: return Launch<1>::Run(args...);
    case 2: return Launch<2>::Run(args...);
    case 3: return Launch<3>::Run(args...);
    case 4: return Launch<4>::Run(args...);
    default: return cudaErrorInvalidValue;
  }
}

template <int kB>
struct GateUpLaunch {
  static cudaError_t Run(dim3 grid, cudaStream_t stream, MoeDeviceWeights w,
                         const __nv_bfloat16* x, int top_k, RouteView route, float limit,
                         float alpha, float* h) {
    GateUpSwigluKernel<kB><<<grid, kThreads, 0, stream>>>(w, x, top_k, route, limit, alpha, h);
    return cudaGetLastError();
  }
};

template <int kB>
struct DownLaunch {
  static cudaError_t Run(dim3 grid, cudaStream_t stream, MoeDeviceWeights w, const float* h,
                         const float* topk_weights, int top_k, RouteView route, float* out) {
    DownScatterKernel<kB><<<grid, kThreads, 0, stream>>>(w, h, topk_weights, top_k, route, out);
    return cudaGetLastError();
  }
};

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
  if (slot < 0 || slot >= w.num_experts || gate_up_blocks == nullptr ||
      gate_up_scales == nullptr || gate_up_bias == nullptr || down_blocks == nullptr ||
      down_scales == nullptr || down_bias == nullptr) {
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

  cudaError_t err = LaunchMoeRoute(topk_ids, pairs, E, count, offset, pair_of, active,
                                   num_active, invalid_ids, stream);
  if (err != cudaSuccess) return err;
  RouteView route{offset, pair_of, active, num_active};
  // At most min(E, pairs) experts are touched: that bounds the grid's second axis.
  const unsigned slots = static_cast<unsigned>(std::min(E, pairs));
  const int H = w.hidden, I = w.intermediate;
  dim3 gu_grid((I + kGateUpOutPerBlock - 1) / kGateUpOutPerBlock, slots);
  err = DispatchBlocks<GateUpLaunch>((H / 32 + 31) / 32, gu_grid, stream, w,
                                     reinterpret_cast<const __nv_bfloat16*>(x), top_k, route,
                                     limit, alpha, h);
  if (err != cudaSuccess) return err;
  dim3 down_grid((H + kDownRowsPerBlock - 1) / kDownRowsPerBlock, slots);
  return DispatchBlocks<DownLaunch>((I / 32 + 31) / 32, down_grid, stream, w,
                                    static_cast<const float*>(h), topk_weights, top_k, route,
                                    out);
}

}  // namespace flotilla::kernels::cuda
