#include <cuda_fp16.h>

#include "kernels/cuda/fp4.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/moe_slice.h"
#include "kernels/cuda/ptx.cuh"

namespace flotilla::kernels::cuda {
namespace {
using ptx::BulkCopy;
using ptx::CpAsyncCommit;
using ptx::MbarExpectTx;
using ptx::MbarInit;
using ptx::MbarWait;
using ptx::MmaF16;
using ptx::SharedAddress;

constexpr int kTileRows = 16;
constexpr float kRescale = 16384.0f;  // 2^14, taken out by the f16 decode

__device__ __forceinline__ float Bf16Value(uint16_t b) {
  return __uint_as_float(static_cast<uint32_t>(b) << 16);
}

// 2^(s - 127) by one shift (s = 0 gives 0, as the decode kernels take it).
__device__ __forceinline__ float ScaleOf(uint8_t s) {
  return __uint_as_float(static_cast<uint32_t>(s) << 23);
}

// One 16-byte cp.async, L1 bypassed. No L2 evict-first hint: with
// `.L2::cache_hint`, ptxas 13.0 encoded the copy with a descriptor register
// its createpolicy had not written, an illegal instruction on an H200
// (compute-sanitizer, cuobjdump), wherever the policy was made.
__device__ __forceinline__ void Copy16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void Copy4(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(dst), "l"(src) : "memory");
}

// The CTA's shape: F features per slice; gate_up tiles of 16 rows over the
// whole H reduction, then down tiles of `down_rows` output rows over the
// slice's F / 32 blocks.
struct Plan {
  int nb;           // H / 32: gate_up blocks per row
  int nbd;          // I / 32: down blocks per row
  int gate_tiles;   // 2F / 16
  int down_rows;    // rows per down tile (a multiple of 16); each row's F / 2
                    // bytes, then per row the 8 aligned bytes holding its scales
  int down_tiles;   // ceil(H / down_rows)
  int gate_stride;  // shared bytes per gate_up row (+16 against bank conflicts)
  int buf_bytes;    // one tile buffer
};

template <int kF>
__host__ __device__ Plan PlanFor(int hidden, int intermediate) {
  Plan p;
  p.nb = hidden / 32;
  p.nbd = intermediate / 32;
  p.gate_tiles = 2 * kF / kTileRows;
  p.gate_stride = p.nb * 16 + 16;
  const int gate_bytes = kTileRows * p.gate_stride + kTileRows * p.nb;
  // Down tiles about as large as a gate_up tile, whole 16-row groups.
  int rows = gate_bytes / (kF / 2 + 8) / kTileRows * kTileRows;
  rows = rows < kTileRows ? kTileRows : rows;
  p.down_rows = rows < hidden ? rows : hidden;
  p.down_tiles = (hidden + p.down_rows - 1) / p.down_rows;
  const int down_bytes = p.down_rows * (kF / 2 + 8);
  p.buf_bytes = ((gate_bytes > down_bytes ? gate_bytes : down_bytes) + 127) & ~127;
  return p;
}

struct Cta {
  int e;      // expert slot
  int s;      // slice
  int begin;  // the expert's first routed pair (index into pair_of)
  int n;      // its routed pairs (tokens), at most kMoeSliceMaxPairs
};

// What a CTA reads again and again, staged once in shared memory (a global
// read inside the tile loops costs an L2 round trip each time).
template <int kF>
struct Staged {
  int token[kMoeSliceMaxPairs];     // the output row of each routed pair
  float weight[kMoeSliceMaxPairs];  // its router weight
  float gate_bias[2 * kF];          // the slice's gate_up biases (gate/up interleaved)
};

// Issues the copies of tile t (gate_up tiles first, then down tiles) into
// `buf`: a gate_up tile's 16 rows and its scales by the bulk copy engine
// onto `bar` (warp 0), a down tile's row pieces and scale words by 16- and
// 4-byte cp.async; one commit group either way.
template <int kF, int kThreads>
__device__ __forceinline__ void CopyTile(const MoeSliceArgs& a, const Plan& p, const Cta& c, int t,
                                         uint8_t* buf, uint64_t* bar) {
  const uint32_t base = SharedAddress(buf);
  if (t < p.gate_tiles) {
    const size_t row0 =
        static_cast<size_t>(c.e) * 2 * a.intermediate + 2 * c.s * kF + t * kTileRows;
    const int lane = threadIdx.x & 31;
    if (threadIdx.x == 0) {
      // The buffer was last read through the generic proxy.
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
      MbarExpectTx(bar, static_cast<uint32_t>(kTileRows * p.nb * 16 + kTileRows * p.nb));
    }
    __syncwarp();
    if (threadIdx.x <= kTileRows) {
      uint64_t policy;
      asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
      if (lane < kTileRows) {
        BulkCopy<true>(buf + lane * p.gate_stride, a.gate_up_blocks + (row0 + lane) * p.nb * 16,
                       static_cast<uint32_t>(p.nb * 16), bar, policy);
      } else {
        BulkCopy<true>(buf + kTileRows * p.gate_stride, a.gate_up_scales + row0 * p.nb,
                       static_cast<uint32_t>(kTileRows * p.nb), bar, policy);
      }
    }
  } else if (t < p.gate_tiles + p.down_tiles) {
    constexpr int kChunks = kF / 32;  // 16-byte blocks per row in the slice
    const int r0 = (t - p.gate_tiles) * p.down_rows;
    const int rows = min(p.down_rows, a.hidden - r0);
    const uint8_t* src =
        a.down_blocks + ((static_cast<size_t>(c.e) * a.hidden + r0) * p.nbd + c.s * kChunks) * 16;
    for (int i = threadIdx.x; i < rows * kChunks; i += kThreads) {
      const int r = i / kChunks, b = i - r * kChunks;
      Copy16(base + i * 16, src + (static_cast<size_t>(r) * p.nbd + b) * 16);
    }
    // A row's scale bytes (at most 3) lie in the two aligned words from the
    // one holding its first.
    const uint8_t* scales =
        a.down_scales + (static_cast<size_t>(c.e) * a.hidden + r0) * p.nbd + c.s * kChunks;
    const uint32_t sbase = base + p.down_rows * (kF / 2);
    for (int i = threadIdx.x; i < rows * 2; i += kThreads) {
      const uintptr_t at =
          reinterpret_cast<uintptr_t>(scales + static_cast<size_t>(i >> 1) * p.nbd);
      Copy4(sbase + i * 4, reinterpret_cast<const void*>((at & ~uintptr_t{3}) + (i & 1) * 4));
    }
  }
  CpAsyncCommit();
}

// One gate_up tile (rows row0..row0 + 15 of the expert, in `sw`): the warps
// split the reduction, meet in `red`, and warp 0 writes the SwiGLU of its 8
// features for every token into hs (f16 high and low parts, permuted).
template <int kF, int kWarps>
__device__ __forceinline__ void GateTile(const MoeSliceArgs& a, const Plan& p, const Cta& c,
                                         const Staged<kF>& st, int row0, const uint8_t* sw,
                                         uint16_t* hs, float (*red)[4][32]) {
  constexpr bool kPrmt = true;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
  const uint8_t* ss = sw + kTileRows * p.gate_stride;
  for (int c0 = 0; c0 < c.n; c0 += 8) {
    const int tl = c0 + g < c.n ? c0 + g : 0;
    const int token = st.token[tl];
    const uint4* xp = a.xh + static_cast<size_t>(token) * p.nb * 4 + q;
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    // x fragments come from L2, two of the warp's blocks ahead.
    uint4 x0 = __ldg(xp + warp * 4);
    uint4 x1 = warp + kWarps < p.nb ? __ldg(xp + (warp + kWarps) * 4) : x0;
#pragma unroll 2
    for (int bl = warp; bl < p.nb; bl += kWarps) {
      const uint4 xv = x0;
      x0 = x1;
      if (bl + 2 * kWarps < p.nb) x1 = __ldg(xp + (bl + 2 * kWarps) * 4);
      const uint32_t w0 =
          *reinterpret_cast<const uint32_t*>(sw + g * p.gate_stride + bl * 16 + 4 * q);
      const uint32_t w1 =
          *reinterpret_cast<const uint32_t*>(sw + (g + 8) * p.gate_stride + bl * 16 + 4 * q);
      const float s0 = ScaleOf(ss[g * p.nb + bl]), s1 = ScaleOf(ss[(g + 8) * p.nb + bl]);
      const Fp4Pairs d0 = DecodeWord<kPrmt>(w0), d1 = DecodeWord<kPrmt>(w1);
      float d[4] = {0.f, 0.f, 0.f, 0.f};
      MmaF16(d, {d0.p[0], d1.p[0], d0.p[1], d1.p[1]}, xv.x, xv.y);
      MmaF16(d, {d0.p[2], d1.p[2], d0.p[3], d1.p[3]}, xv.z, xv.w);
      acc[0] = fmaf(d[0], s0, acc[0]);
      acc[1] = fmaf(d[1], s0, acc[1]);
      acc[2] = fmaf(d[2], s1, acc[2]);
      acc[3] = fmaf(d[3], s1, acc[3]);
    }
    if (warp > 0) {
#pragma unroll
      for (int i = 0; i < 4; ++i) red[warp - 1][i][lane] = acc[i];
    }
    __syncthreads();
    if (warp == 0) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
#pragma unroll
        for (int w = 0; w < kWarps - 1; ++w) acc[i] += red[w][i][lane];
        acc[i] *= kRescale;
      }
      // Rows interleave gate (even) and up (odd): lane ^ 4 holds row g ^ 1.
      float up[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) up[i] = __shfl_xor_sync(0xFFFFFFFFu, acc[i], 4);
      if ((g & 1) == 0) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int j = (row0 + g + 8 * half) / 2;  // the expert's feature
          const float bg = st.gate_bias[2 * j - 2 * c.s * kF];
          const float bu = st.gate_bias[2 * j + 1 - 2 * c.s * kF];
          const int pos = Fp4PermutedIndex(j - c.s * kF);
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            const int t = c0 + 2 * q + i;
            if (t < c.n) {
              float gate = fminf(acc[2 * half + i] + bg, a.limit);
              const float u = fminf(fmaxf(up[2 * half + i] + bu, -a.limit), a.limit);
              const float glu = gate * (1.0f / (1.0f + expf(-(gate * a.alpha))));
              const float hv = (u + 1.0f) * glu;
              const __half hi = __float2half_rn(hv);
              const __half lo = __float2half_rn(hv - __half2float(hi));
              hs[(2 * t) * kF + pos] = __half_as_ushort(hi);
              hs[(2 * t + 1) * kF + pos] = __half_as_ushort(lo);
            }
          }
        }
      }
    }
    __syncthreads();  // red is reused
  }
}

// One down tile (output rows r0.., in `sd`, F / 32 blocks per row): each warp
// takes whole 16-row groups, the 8 mma columns the high and low parts of 4
// tokens' h slice, and adds its partial sums into the output rows.
template <int kF, int kWarps>
__device__ __forceinline__ void DownTile(const MoeSliceArgs& a, const Plan& p, const Cta& c,
                                         const Staged<kF>& st, int r0, const uint8_t* sd,
                                         const uint16_t* hs) {
  constexpr int kChunks = kF / 32;
  constexpr bool kPrmt = true;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
  const int H = a.hidden;
  const int rows = min(p.down_rows, H - r0);
  const uint8_t* scales = a.down_scales + static_cast<size_t>(c.e) * H * p.nbd + c.s * kChunks;
  const uint8_t* ssd = sd + p.down_rows * (kF / 2);  // 8 bytes per row (CopyTile)
  const uint16_t* bias = a.down_bias + static_cast<size_t>(c.e) * H;
  const uint4* h4 = reinterpret_cast<const uint4*>(hs);
  for (int grp = warp; grp * kTileRows < rows; grp += kWarps) {
    const int lr = grp * kTileRows + g;  // the lane's first row in the tile
    const uint8_t* sc0 =
        ssd + lr * 8 +
        (reinterpret_cast<uintptr_t>(scales + static_cast<size_t>(r0 + lr) * p.nbd) & 3);
    const uint8_t* sc1 =
        ssd + (lr + 8) * 8 +
        (reinterpret_cast<uintptr_t>(scales + static_cast<size_t>(r0 + lr + 8) * p.nbd) & 3);
    // Slice 0 adds the bias: its loads go out before the math.
    const float bias0 = c.s == 0 ? Bf16Value(bias[r0 + lr]) : 0.f;
    const float bias1 = c.s == 0 ? Bf16Value(bias[r0 + lr + 8]) : 0.f;
    uint32_t w0[kChunks], w1[kChunks];
    float s0[kChunks], s1[kChunks];
#pragma unroll
    for (int b = 0; b < kChunks; ++b) {
      w0[b] = *reinterpret_cast<const uint32_t*>(sd + lr * (kF / 2) + b * 16 + 4 * q);
      w1[b] = *reinterpret_cast<const uint32_t*>(sd + (lr + 8) * (kF / 2) + b * 16 + 4 * q);
      s0[b] = ScaleOf(sc0[b]);
      s1[b] = ScaleOf(sc1[b]);
    }
    for (int c0 = 0; c0 < c.n; c0 += 4) {
      // Column g: token c0 + g % 4, its high (g < 4) or low part.
      const int tl = c0 + (g & 3) < c.n ? c0 + (g & 3) : 0;
      const uint4* hp = h4 + (2 * tl + (g >> 2)) * (kF / 8) + q;
      float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int b = 0; b < kChunks; ++b) {
        const uint4 hv = hp[b * 4];
        const Fp4Pairs d0 = DecodeWord<kPrmt>(w0[b]), d1 = DecodeWord<kPrmt>(w1[b]);
        float d[4] = {0.f, 0.f, 0.f, 0.f};
        MmaF16(d, {d0.p[0], d1.p[0], d0.p[1], d1.p[1]}, hv.x, hv.y);
        MmaF16(d, {d0.p[2], d1.p[2], d0.p[3], d1.p[3]}, hv.z, hv.w);
        acc[0] = fmaf(d[0], s0[b], acc[0]);
        acc[1] = fmaf(d[1], s0[b], acc[1]);
        acc[2] = fmaf(d[2], s1[b], acc[2]);
        acc[3] = fmaf(d[3], s1[b], acc[3]);
      }
      // Columns 2q, 2q + 1 (q < 2) are the high parts of tokens c0 + 2q,
      // c0 + 2q + 1; lane ^ 2 holds their low parts.
      float lo[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) lo[i] = __shfl_xor_sync(0xFFFFFFFFu, acc[i], 2);
      if (q < 2) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int row = r0 + lr + 8 * half;
          const float bd = half == 0 ? bias0 : bias1;
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            const int t = c0 + 2 * q + i;
            if (t < c.n) {
              const float v = (acc[2 * half + i] + lo[2 * half + i]) * kRescale + bd;
              atomicAdd(a.out + static_cast<size_t>(st.token[t]) * H + row, st.weight[t] * v);
            }
          }
        }
      }
    }
  }
}

template <int kF, int kBufs, int kWarps>
__global__ void __launch_bounds__(32 * kWarps) MoeSliceKernel(MoeSliceArgs a) {
  constexpr int kThreads = 32 * kWarps;
  extern __shared__ float4 smem_f4[];
  uint8_t* smem = reinterpret_cast<uint8_t*>(smem_f4);
  __shared__ float red[kWarps - 1][4][32];
  __shared__ __align__(16) uint16_t hs[kMoeSliceMaxPairs * 2 * kF];
  const Plan p = PlanFor<kF>(a.hidden, a.intermediate);
  const int slices = a.intermediate / kF;
  // The routing and x come from the kernel before.
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  const int slot = blockIdx.x / slices;
  if (slot >= *a.num_active) return;
  Cta c;
  c.e = a.active[slot];
  c.s = blockIdx.x - slot * slices;
  c.begin = a.offset[c.e];
  c.n = min(a.offset[c.e + 1] - c.begin, kMoeSliceMaxPairs);
  const int tiles = p.gate_tiles + p.down_tiles;
  __shared__ __align__(8) uint64_t bars[kBufs];
  __shared__ Staged<kF> st;
  if (threadIdx.x == 0) {
    for (int i = 0; i < kBufs; ++i) MbarInit(&bars[i], 1);
  }
  if (threadIdx.x < c.n) {
    const int pair = a.pair_of[c.begin + threadIdx.x];
    st.token[threadIdx.x] = pair / a.top_k;
    st.weight[threadIdx.x] = a.topk_weights[pair];
  }
  const uint16_t* gate_bias =
      a.gate_up_bias + static_cast<size_t>(c.e) * 2 * a.intermediate + 2 * c.s * kF;
  for (int i = threadIdx.x; i < 2 * kF; i += kThreads) st.gate_bias[i] = Bf16Value(gate_bias[i]);
  __syncthreads();
#pragma unroll
  for (int i = 0; i < kBufs; ++i) {
    CopyTile<kF, kThreads>(a, p, c, i, smem + i * p.buf_bytes, &bars[i]);
  }
  for (int t = 0; t < tiles; ++t) {
    uint8_t* buf = smem + (t % kBufs) * p.buf_bytes;
    if (t < p.gate_tiles) {
      MbarWait(&bars[t % kBufs], static_cast<uint32_t>(t / kBufs) & 1u);
    } else {
      ptx::CpAsyncWait<kBufs - 1>();
    }
    __syncthreads();  // tile t has landed for every thread; hs is complete for the down tiles
    if (t < p.gate_tiles) {
      GateTile<kF, kWarps>(a, p, c, st, 2 * c.s * kF + t * kTileRows, buf, hs, red);
    } else {
      DownTile<kF, kWarps>(a, p, c, st, (t - p.gate_tiles) * p.down_rows, buf, hs);
    }
    __syncthreads();  // the buffer is free
    CopyTile<kF, kThreads>(a, p, c, t + kBufs, buf,
                           &bars[t % kBufs]);  // past the last tile: an empty group
  }
}

template <int kF, int kBufs, int kWarps>
cudaError_t Launch(const MoeSliceArgs& a, int slots, bool pdl, cudaStream_t stream) {
  const Plan p = PlanFor<kF>(a.hidden, a.intermediate);
  const size_t smem = static_cast<size_t>(kBufs) * p.buf_bytes;
  auto kernel = MoeSliceKernel<kF, kBufs, kWarps>;
  static PerDevice<size_t> allowed;
  cudaError_t err = AllowSharedBytes(kernel, smem, &allowed);
  if (err != cudaSuccess) return err;
  const int grid = slots * (a.intermediate / kF);
  return LaunchPdl(kernel, dim3(grid), dim3(32 * kWarps), smem, stream, pdl, a);
}

template <int kF>
cudaError_t LaunchF(const MoeSliceArgs& a, int slots, int buffers, int warps, bool pdl,
                    cudaStream_t stream) {
  if (warps >= 8) {
    return buffers <= 1 ? Launch<kF, 1, 8>(a, slots, pdl, stream)
                        : Launch<kF, 2, 8>(a, slots, pdl, stream);
  }
  return buffers <= 1 ? Launch<kF, 1, 4>(a, slots, pdl, stream)
                      : Launch<kF, 2, 4>(a, slots, pdl, stream);
}

}  // namespace

int MoeSliceFeatures(int pairs, int intermediate, int features) {
  if (pairs < 1 || pairs > kMoeSliceMaxPairs) return 0;
  if (features != 0) {
    return (features == 32 || features == 64 || features == 96) && intermediate % features == 0
               ? features
               : 0;
  }
  const int widest = pairs <= 8 ? 32 : pairs <= 16 ? 64 : 96;
  for (int f = widest; f >= 32; f -= 32) {
    if (intermediate % f == 0) return f;
  }
  return 0;
}

cudaError_t LaunchMoeSlices(const MoeSliceArgs& args, int slots, int pairs, int features,
                            int buffers, int warps, bool pdl, cudaStream_t stream) {
  const int f = MoeSliceFeatures(pairs, args.intermediate, features);
  if (f == 0 || slots <= 0) return cudaErrorInvalidValue;
  switch (f) {
    case 32:
      return LaunchF<32>(args, slots, buffers, warps, pdl, stream);
    case 64:
      return LaunchF<64>(args, slots, buffers, warps, pdl, stream);
    default:
      return LaunchF<96>(args, slots, buffers, warps, pdl, stream);
  }
}

}  // namespace flotilla::kernels::cuda
