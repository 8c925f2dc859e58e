#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "kernels/cuda/fp4.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/moe.h"
#include "kernels/cuda/moe_diagnostic.h"
#include "kernels/cuda/moe_gemm.h"
#include "kernels/cuda/moe_route.cuh"
#include "kernels/cuda/ptx.cuh"

namespace flotilla::kernels::cuda {
namespace {
using ptx::BlockExclusiveScan;
using ptx::MbarExpectTx;
using ptx::MbarInit;
using ptx::MbarWait;
using ptx::MmaF16;
using ptx::SharedAddress;

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

// ---------------------------------------------------------------------------
// Tensor-core path (the default). Weights are decoded to f16 in registers and
// multiplied on the tensor cores (mma.sync m16n8k16, f32 accumulation):
//   * a CTA of kMmaWarps warps owns 16 weight rows of one expert over the whole
//     reduction; the rows' packed blocks and scales arrive in shared memory by
//     the bulk copy engine (cp.async.bulk, completing on an mbarrier), so each
//     byte is read from HBM once, in full lines, with no registers held;
//   * the warps split the reduction (block b goes to warp b % kMmaWarps) and
//     meet in shared memory at the end;
//   * the 8 mma columns are 8 of the expert's tokens (gate_up) or the high and
//     low f16 halves of 4 of its f32 activations (down), so 1 to 8 tokens cost
//     the same and more tokens loop over the weights held in shared memory;
//   * activations come pre-converted to f16 in the order the fragments want
//     (below), one 16-byte load per thread per block, mostly from L1/L2.
// The weights decode to fp4 * 2^-14 in f16 (fp4.cuh); the 2^14 comes back
// with the block scale, 2^(s - 127 + 14).
//
// Fragment order: thread (g = lane / 4, q = lane % 4) holds the 32-bit word q
// of a 32-value block, i.e. values 8q..8q+7 of rows g and g + 8. Decoded pairs
// (v0,v4) (v1,v5) of that word feed the first mma (k slots 2q,2q+1 and
// 2q+8,2q+9) and (v2,v6) (v3,v7) the second; the dot product is a sum, so the
// activations only need the same permutation: each 8-value group is stored as
// f16 [v0, v4, v1, v5, v2, v6, v3, v7].
constexpr int kMmaWarps = 4;
constexpr int kMmaThreads = 32 * kMmaWarps;
constexpr int kTileRows = 16;
// Bytes the kernels may read past the last activation row (see MmaTile):
// (kRing + kAhead) * kMmaWarps blocks of 64 bytes, rounded up.
constexpr size_t kActivationSlack = 4096;

template <bool kEvictFirst>
__device__ __forceinline__ void BulkCopy(void* dst, const void* src, uint32_t bytes, uint64_t* bar,
                                         uint64_t policy) {
  if constexpr (kEvictFirst) {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
        " [%0], [%1], %2, [%3], %4;" ::"r"(SharedAddress(dst)),
        "l"(src), "r"(bytes), "r"(SharedAddress(bar)), "l"(policy)
        : "memory");
  } else {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"
        " [%0], [%1], %2, [%3];" ::"r"(SharedAddress(dst)),
        "l"(src), "r"(bytes), "r"(SharedAddress(bar))
        : "memory");
  }
}

__device__ __forceinline__ void GridDependencyWait() {
  asm volatile("griddepcontrol.wait;" ::: "memory");
}
__device__ __forceinline__ void GridDependentsMayLaunch() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

// Scales: 2^(s - 127) from a scale byte in shared memory by one shift, exact
// for s >= 1; s = 0 (2^-127, blocks of magnitude <= 6 * 2^-127) gives 0. The
// 2^14 taken out by the f16 decode is put back once per output, after the
// reduction.
constexpr float kMmaRescale = 16384.0f;  // 2^14


// Position of value j of a row inside its permuted f16 layout.
__device__ __forceinline__ int PermutedIndex(int j) {
  const int v = j & 31, r = v & 7;
  return (j & ~31) + (v & ~7) + (r & 3) * 2 + (r >> 2);
}

struct MmaArgs {
  const uint8_t* blocks;  // [E, rows, nb, 16]
  const uint8_t* scales;  // [E, rows, nb]
  const uint16_t* bias;   // [E, rows]
  int rows;
  int nb;                 // 32-value blocks per row
  const uint4* act;       // gate_up: xh [T, H] f16 permuted; down: hh [P, 2, I]
  RouteView route;
  int top_k;
  float limit, alpha;
  uint16_t* h_out;  // gate_up: hh [P, 2, I] (f16 high then low part, permuted)
  const float* topk_weights;
  float* out;         // down: [T, H] f32, added into
  float* pair_rows;   // down, deterministic: [pairs, H] f32 (zeroed), a row per pair, not out
  int ksplit;         // down: CTAs per row tile, each a share of the reduction
  bool evict_first;   // L2 evict-first hint on the weight copies
  bool copy_only;     // diagnostic (MoeDiagnostic::kCopyOnly; moe_diagnostic.h)
  bool math_only;     // diagnostic (MoeDiagnostic::kMathOnly)
  // Both projections in one launch (MoeMmaFusedKernel): gate_up tiles
  // finished per active expert slot (zeroed by the routing), which the
  // slot's down tiles wait for until it reaches `gu_tiles`.
  int* done;
  int gu_tiles;
};

// The end of one pass over a tile's reduction, one group of 8 mma columns at
// a time: every warp leaves its partial sums (acc) in `red`, then each of
// the group's 64 outputs is one thread's: it adds the four warps' parts and
// runs the epilogue for the pass's tokens [c, end): gate_up's bias + clamped
// SwiGLU into h (f16 high and low parts, permuted), or down's bias, router
// weight and scatter-add. Spread over two warps, the epilogue no longer holds
// three warps of the CTA at its barrier while one works through it.
// Accumulator element i of lane (g, q) is row g + 8 * (i >> 1), column
// 2q + (i & 1) of the 16 x 8 tile.
__device__ __forceinline__ float TileSum(const float (*red)[4][32], int row, int col) {
  const int i = 2 * (row >> 3) + (col & 1), lane = (row & 7) * 4 + (col >> 1);
  float v = 0.f;
#pragma unroll
  for (int w = 0; w < kMmaWarps; ++w) v += red[w][i][lane];
  return v * kMmaRescale;
}

// What thread t's epilogue output of one column group [c0, c0 + 8 columns)
// reads from global memory besides the tile's sums (its biases and the
// token's pair), loaded ahead of the tile's math when there is one group so
// their latency hides behind it. Down's router weight, which needs the
// pair, stays in the epilogue: loaded ahead, its wait for the pair would
// stall the warp before the math (H200, 64 tokens 611 -> 620 us a layer).
struct EpilogueIn {
  float b0 = 0.f, b1 = 0.f;
  int pair = 0;
};

template <bool kDown>
__device__ __forceinline__ EpilogueIn LoadEpilogueIn(const MmaArgs& a, int e, int row0, int part,
                                                     int c0, int end) {
  const int t = threadIdx.x;
  const uint16_t* bias = a.bias + static_cast<size_t>(e) * a.rows;
  EpilogueIn in;
  if constexpr (!kDown) {
    // Thread t: row pair t >> 3 (gate row even, up row odd), token column t & 7.
    const int tok = c0 + (t & 7);
    if (t < 64 && tok < end) {
      const int j = row0 / 2 + (t >> 3);
      in.b0 = Bf16Bits(bias[2 * j]);
      in.b1 = Bf16Bits(bias[2 * j + 1]);
      in.pair = a.route.pair_of[tok];
    }
  } else {
    // Thread t: row t >> 2, token t & 3.
    const int tok = c0 + (t & 3);
    if (t < 64 && tok < end) {
      in.pair = a.route.pair_of[tok];
      in.b0 = part == 0 ? Bf16Bits(bias[row0 + (t >> 2)]) : 0.f;
    }
  }
  return in;
}

// `pre`: group 0's EpilogueIn, loaded ahead (MmaTile's kEpilogueAhead), else null.
template <bool kDown, int kGroups>
__device__ __forceinline__ void MmaReduceAndStore(const MmaArgs& a, int e, int row0, int part,
                                                  int c, int end, const float (&acc)[kGroups][4],
                                                  float (*red)[4][32], const EpilogueIn* pre) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, t = threadIdx.x;
  constexpr int kCols = kDown ? 4 : 8;  // tokens per group of 8 mma columns
#pragma unroll
  for (int G = 0; G < kGroups; ++G) {
#pragma unroll
    for (int i = 0; i < 4; ++i) red[warp][i][lane] = acc[G][i];
    __syncthreads();
    const int c0 = c + G * kCols;
    const EpilogueIn in =
        pre != nullptr && G == 0 ? *pre : LoadEpilogueIn<kDown>(a, e, row0, part, c0, end);
    if constexpr (!kDown) {
      const int pair_row = 2 * (t >> 3), col = t & 7, tok = c0 + col;
      if (t < 64 && tok < end) {
        const int I = a.rows / 2, j = row0 / 2 + (t >> 3);
        float gate = TileSum(red, pair_row, col) + in.b0;
        float u = TileSum(red, pair_row + 1, col) + in.b1;
        gate = fminf(gate, a.limit);
        u = fminf(fmaxf(u, -a.limit), a.limit);
        const float glu = gate * (1.0f / (1.0f + expf(-(gate * a.alpha))));
        const float hv = (u + 1.0f) * glu;
        const __half hi = __float2half_rn(hv);
        const __half lo = __float2half_rn(hv - __half2float(hi));
        uint16_t* dst = a.h_out + static_cast<size_t>(in.pair) * 2 * I + PermutedIndex(j);
        dst[0] = __half_as_ushort(hi);
        dst[I] = __half_as_ushort(lo);
      }
    } else {
      // Thread t: row t >> 2, token t & 3, whose high part is column t & 3
      // and low part column (t & 3) + 4.
      const int row = t >> 2, col = t & 3, tok = c0 + col;
      if (t < 64 && tok < end) {
        const int H = a.rows, grow = row0 + row;
        const float v = TileSum(red, row, col) + TileSum(red, row, col + 4) + in.b0;
        float* dst = a.pair_rows != nullptr
                         ? a.pair_rows + static_cast<size_t>(in.pair) * H + grow
                         : a.out + static_cast<size_t>(in.pair / a.top_k) * H + grow;
        atomicAdd(dst, a.topk_weights[in.pair] * v);
      }
    }
    __syncthreads();  // red is written again by the next group or pass
  }
}

// kDown selects the projection (epilogue and column meaning); kGroups groups
// of 8 columns share one decode of each weight block.
// One 16-row tile (rows row0.., blocks [kb0, kb0 + nbl) of expert e) whose
// weights are landing in (sw, ss) on `bar` (phase `parity`): all the expert's
// tokens, 8 mma columns x kGroups at a time, then the epilogue.
// Activation fragments: through the read-only path, or (kWeak: h written by
// other CTAs of the same launch, after an acquire) by a plain load, which
// the acquire orders after those writes.
template <bool kWeak>
__device__ __forceinline__ uint4 LoadAct(const uint4* p) {
  if constexpr (kWeak) {
    uint4 v;
    asm volatile("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
  } else {
    return __ldg(p);
  }
}

// kEpilogueAhead (one column group): the epilogue's loads go out before the
// math (EpilogueIn). On for the fused launch (H200, three A/B runs: engine
// step batch 4 5.01-5.06 -> 4.96-5.00 ms, batch 1 unchanged within noise;
// moe_cuda_bench 4 tokens 89.3-91.0 -> 87.9-89.5 us), off for the
// two-launch kernels, where it measured slower (64 tokens 609-613 ->
// 616-622 us a layer, engine batch 64 +1%).
template <bool kDown, int kGroups, bool kPrmt, bool kWeakAct = false, bool kEpilogueAhead = false>
__device__ __forceinline__ void MmaTile(const MmaArgs& a, int e, int row0, int part, int kb0,
                                        int nbl, const uint8_t* sw, const uint8_t* ss, int stride,
                                        uint64_t* bar, uint32_t parity, float (*red)[4][32]) {
  const int nb = a.nb;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
  constexpr int kCols = kDown ? 4 : 8;  // tokens per group of 8 mma columns
  const int begin = a.route.offset[e], end = a.route.offset[e + 1];
  const size_t act_row = static_cast<size_t>(nb) * 4;  // uint4 per activation row
  bool waited = false;
  for (int c = begin; c < end; c += kCols * kGroups) {
    constexpr bool kLoadsAhead = kEpilogueAhead && kGroups == 1;
    EpilogueIn epilogue_in;
    if constexpr (kLoadsAhead) epilogue_in = LoadEpilogueIn<kDown>(a, e, row0, part, c, end);
    const uint4* src[kGroups];
    bool has[kGroups];
#pragma unroll
    for (int G = 0; G < kGroups; ++G) {
      const int t = c + G * kCols + (kDown ? (g & 3) : g);
      has[G] = t < end;
      const int pair = has[G] ? a.route.pair_of[t] : 0;
      src[G] = kDown ? a.act + (static_cast<size_t>(pair) * 2 + (g >> 2)) * act_row
                     : a.act + static_cast<size_t>(pair / a.top_k) * act_row;
      src[G] += q + kb0 * 4;
    }
    // Activation fragments come from L2 (or L1): with one column group they
    // are loaded kAhead blocks ahead in a register ring (the first ones before
    // the weights have landed), so their latency overlaps the math. The loads
    // are unconditional, through pointers that step with the blocks: a column
    // past the expert's tokens reads token pair 0's row and a block past the
    // row end reads on into the buffer (MoeWorkspaceBytes pads its end);
    // either only feeds mma columns or blocks whose results are dropped.
    constexpr int kAhead = kGroups == 1 ? 2 : 0;
    constexpr int kRing = kAhead + 1;
    constexpr int kStep = kMmaWarps * 4;  // uint4 between a warp's blocks
    const uint4* ap[kGroups];
#pragma unroll
    for (int G = 0; G < kGroups; ++G) ap[G] = src[G] + warp * 4;
    uint4 ring[kRing][kGroups];
#pragma unroll
    for (int j = 0; j < kAhead; ++j) {
#pragma unroll
      for (int G = 0; G < kGroups; ++G) ring[j][G] = LoadAct<kWeakAct>(ap[G] + j * kStep);
    }
    // The lane's two scale rows, stepping with the blocks.
    const uint8_t* sp0 = ss + g * nb + kb0 + warp;
    const uint8_t* sp1 = sp0 + 8 * nb;
    if (!waited && !a.math_only) MbarWait(bar, parity);
    waited = true;

    float acc[kGroups][4];
#pragma unroll
    for (int G = 0; G < kGroups; ++G) acc[G][0] = acc[G][1] = acc[G][2] = acc[G][3] = 0.f;
#pragma unroll 1
    for (int bl0 = warp; bl0 < nbl; bl0 += kMmaWarps * kRing) {
#pragma unroll
      for (int j = 0; j < kRing; ++j) {
        const int bl = bl0 + kMmaWarps * j;
#pragma unroll
        for (int G = 0; G < kGroups; ++G) {
          ring[(j + kAhead) % kRing][G] = LoadAct<kWeakAct>(ap[G] + (j + kAhead) * kStep);
        }
        if (bl < nbl) {
          const uint32_t w0 =
              *reinterpret_cast<const uint32_t*>(sw + g * stride + bl * 16 + 4 * q);
          const uint32_t w1 =
              *reinterpret_cast<const uint32_t*>(sw + (g + 8) * stride + bl * 16 + 4 * q);
          const float s0 = __uint_as_float(static_cast<uint32_t>(sp0[kMmaWarps * j]) << 23);
          const float s1 = __uint_as_float(static_cast<uint32_t>(sp1[kMmaWarps * j]) << 23);
          const Fp4Pairs d0 = DecodeWord<kPrmt>(w0), d1 = DecodeWord<kPrmt>(w1);
#pragma unroll
          for (int G = 0; G < kGroups; ++G) {
            const uint4 xv = ring[j][G];
            float d[4] = {0.f, 0.f, 0.f, 0.f};
            MmaF16(d, {d0.p[0], d1.p[0], d0.p[1], d1.p[1]}, xv.x, xv.y);
            MmaF16(d, {d0.p[2], d1.p[2], d0.p[3], d1.p[3]}, xv.z, xv.w);
            acc[G][0] = fmaf(d[0], s0, acc[G][0]);
            acc[G][1] = fmaf(d[1], s0, acc[G][1]);
            acc[G][2] = fmaf(d[2], s1, acc[G][2]);
            acc[G][3] = fmaf(d[3], s1, acc[G][3]);
          }
        }
      }
#pragma unroll
      for (int G = 0; G < kGroups; ++G) ap[G] += kRing * kStep;
      sp0 += kMmaWarps * kRing;
      sp1 += kMmaWarps * kRing;
    }
    MmaReduceAndStore<kDown, kGroups>(a, e, row0, part, c, end, acc, red,
                                      kLoadsAhead ? &epilogue_in : nullptr);
  }
  if (!waited && !a.math_only) MbarWait(bar, parity);  // never leave with a copy in flight
}

// Issues the bulk copies of one tile's weight rows and scales into a buffer.
__device__ __forceinline__ void CopyTile(const MmaArgs& a, int e, int row0, int kb0, int nbl,
                                         uint8_t* buf, int stride, uint64_t* bar) {
  if (a.math_only) return;
  const int lane = threadIdx.x & 31;
  const int nb = a.nb, row_bytes = nbl * 16;
  const size_t grow0 = static_cast<size_t>(e) * a.rows + row0;
  if (threadIdx.x == 0) MbarExpectTx(bar, static_cast<uint32_t>(kTileRows * (row_bytes + nb)));
  __syncwarp();
  if (threadIdx.x < 32 && lane <= kTileRows) {
    const void* src =
        lane < kTileRows
            ? static_cast<const void*>(a.blocks + ((grow0 + lane) * nb + kb0) * 16)
            : static_cast<const void*>(a.scales + grow0 * nb);
    void* dst = lane < kTileRows ? static_cast<void*>(buf + lane * stride)
                                 : static_cast<void*>(buf + kTileRows * stride);
    const uint32_t bytes = static_cast<uint32_t>(lane < kTileRows ? row_bytes : kTileRows * nb);
    if (a.evict_first) {
      uint64_t policy;
      asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
      BulkCopy<true>(dst, src, bytes, bar, policy);
    } else {
      BulkCopy<false>(dst, src, bytes, bar, 0);
    }
  }
}

// Tile t of a projection (slot-major, ksplit CTAs per 16-row tile): its
// expert, first row, reduction share and that share's blocks.
struct MmaTilePos {
  int slot, e, row0, part, kb0, nbl;
};

__device__ __forceinline__ MmaTilePos TileAt(const MmaArgs& a, int t, int ksplit) {
  const int tiles_per_expert = a.rows / kTileRows * ksplit;
  const int within = t % tiles_per_expert;
  MmaTilePos x;
  x.slot = t / tiles_per_expert;
  x.e = a.route.active[x.slot];
  x.row0 = (within / ksplit) * kTileRows;
  x.part = within % ksplit;
  x.kb0 = x.part * a.nb / ksplit;
  x.nbl = (x.part + 1) * a.nb / ksplit - x.kb0;
  return x;
}

// The grouped projection. Tile t (of num_active * tiles_per_expert) is expert
// slot t / tiles_per_expert, row tile (t % tiles_per_expert) / ksplit, part
// t % ksplit. Each CTA takes tiles blockIdx.x, + gridDim.x, ... through kBufs
// shared-memory buffers: the copies of the next kBufs - 1 tiles are in flight
// while one is computed (kBufs = 1: one tile per CTA, the grid covers all).
template <bool kDown, int kGroups, bool kPrmt, int kBufs>
__global__ void __launch_bounds__(kMmaThreads)
    MoeMmaKernel(MmaArgs a) {
  extern __shared__ float4 smem_f4[];
  uint8_t* smem = reinterpret_cast<uint8_t*>(smem_f4);
  __shared__ __align__(8) uint64_t bars[kBufs];
  __shared__ float red[kMmaWarps][4][32];
  const int ksplit = kDown ? a.ksplit : 1;
  const int tiles_per_expert = a.rows / kTileRows * ksplit;
  const int nb = a.nb;
  const int nbl_max = (nb + ksplit - 1) / ksplit;
  const int stride = nbl_max * 16 + 16;
  const int buf_bytes = kTileRows * stride + kTileRows * nb;
  // gate_up needs the routing before its first copy; the down projection
  // reads it at once (complete once every gate_up CTA has passed its wait)
  // and brings in its weights while gate_up drains.
  if (!kDown) GridDependencyWait();
  const int total = *a.route.num_active * tiles_per_expert;
  if (static_cast<int>(blockIdx.x) >= total) {
    GridDependencyWait();
    return;
  }
  if (threadIdx.x == 0) {
    for (int i = 0; i < kBufs; ++i) MbarInit(&bars[i], 1);
  }
  __syncthreads();
  auto tile_of = [&](int t) { return TileAt(a, t, ksplit); };
#pragma unroll
  for (int i = 0; i < kBufs; ++i) {
    const int t = blockIdx.x + i * gridDim.x;
    if (t < total) {
      const MmaTilePos x = tile_of(t);
      CopyTile(a, x.e, x.row0, x.kb0, x.nbl, smem + i * buf_bytes, stride, &bars[i]);
    }
  }
  // Activations come from the kernels before; the ones after may start once
  // every CTA is here.
  GridDependencyWait();
  GridDependentsMayLaunch();
  int i = 0;
  for (int t = blockIdx.x; t < total; t += gridDim.x, ++i) {
    const int buf = i % kBufs;
    const uint32_t parity = static_cast<uint32_t>(i / kBufs) & 1u;
    const MmaTilePos x = tile_of(t);
    uint8_t* sw = smem + buf * buf_bytes;
    if (a.copy_only) {  // diagnostic: the copies alone
      MbarWait(&bars[buf], parity);
      __syncthreads();
    } else {
      MmaTile<kDown, kGroups, kPrmt>(a, x.e, x.row0, x.part, x.kb0, x.nbl, sw,
                                     sw + kTileRows * stride, stride, &bars[buf], parity, red);
    }
    // MmaTile ends with a CTA barrier: the buffer is free for tile t + kBufs * grid.
    const int tn = t + kBufs * gridDim.x;
    if (kBufs > 1 && tn < total) {
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
      const MmaTilePos y = tile_of(tn);
      CopyTile(a, y.e, y.row0, y.kb0, y.nbl, sw, stride, &bars[buf]);
    }
  }
}

// One tile of a fused launch (below): tile t of projection `a`, its weights
// copied at once; a down tile then waits for its expert's gate_up tiles,
// and a gate_up tile counts itself done once its part of h is stored.
template <bool kDown, int kGroups, bool kPrmt>
__device__ __forceinline__ void FusedTile(const MmaArgs& a, int t, uint8_t* smem, uint64_t* bar,
                                          float (*red)[4][32]) {
  const int ksplit = kDown ? a.ksplit : 1;
  if (t >= *a.route.num_active * (a.rows / kTileRows * ksplit)) return;
  const int stride = (a.nb + ksplit - 1) / ksplit * 16 + 16;
  const MmaTilePos x = TileAt(a, t, ksplit);
  if (threadIdx.x == 0) MbarInit(bar, 1);
  __syncthreads();
  CopyTile(a, x.e, x.row0, x.kb0, x.nbl, smem, stride, bar);
  if constexpr (kDown) {
    if (threadIdx.x == 0) {
      ptx::WaitAtLeast(a.done + x.slot, a.gu_tiles);
    }
    __syncthreads();
  }
  MmaTile<kDown, kGroups, kPrmt, kDown, true>(a, x.e, x.row0, x.part, x.kb0, x.nbl, smem,
                                              smem + kTileRows * stride, stride, bar, 0, red);
  if constexpr (!kDown) {
    // MmaTile ends with a CTA barrier after the tile's last store of h.
    if (threadIdx.x == 0) {
      ptx::ReleaseAdd(a.done + x.slot);
    }
  }
}

// Both decode projections in one launch, one tile per CTA: CTAs [0,
// gu_grid) are gate_up tiles and the rest down tiles, each in expert-slot
// order. Down work fills the slots that gate_up's last partial wave leaves
// free, and a down tile's weights land while its expert's h is still being
// computed (two launches: the down tiles start once all of gate_up is done).
// The wait always ends: a down tile waits only for gate_up tiles, which
// wait on nothing and have lower indices (the hardware dispatches a 1-D
// grid's blocks in index order, so they are resident or done before any
// down tile takes a slot).
template <int kGroups, bool kPrmt>
__global__ void __launch_bounds__(kMmaThreads)
    MoeMmaFusedKernel(MmaArgs gu, MmaArgs dn, int gu_grid) {
  extern __shared__ float4 smem_f4[];
  uint8_t* smem = reinterpret_cast<uint8_t*>(smem_f4);
  __shared__ __align__(8) uint64_t bar;
  __shared__ float red[kMmaWarps][4][32];
  GridDependencyWait();  // the routing and x come from the kernels before
  GridDependentsMayLaunch();
  const int b = static_cast<int>(blockIdx.x);
  if (b < gu_grid) {
    FusedTile<false, kGroups, kPrmt>(gu, b, smem, &bar, red);
  } else {
    FusedTile<true, kGroups, kPrmt>(dn, b - gu_grid, smem, &bar, red);
  }
}

// Routing (block 0, BuildMoeRouting) and, in the other blocks, the bf16 ->
// permuted f16 conversion of x, 8 values per thread.
__global__ void __launch_bounds__(kRouteThreads)
    RoutePrepKernel(const int32_t* ids, int pairs, MoeRouteTargets route, const uint4* x,
                    size_t x_vecs) {
  GridDependencyWait();  // ids and x come from the kernels before
  GridDependentsMayLaunch();
  if (blockIdx.x > 0) {
    uint4* xh = reinterpret_cast<uint4*>(route.xh);
    for (size_t i = (blockIdx.x - 1) * size_t{blockDim.x} + threadIdx.x; i < x_vecs;
         i += size_t{gridDim.x - 1} * blockDim.x) {
      xh[i] = Bf16x8ToMoeHalves(x[i]);
    }
    return;
  }
  BuildMoeRouting<kMaxExperts>(ids, pairs, route);
}

// Deterministic mode's sum: out[t] += ((row[t, 0] + row[t, 1]) + ...) over
// the token's K pair rows in choice order, 4 values per thread.
__global__ void SumPairRowsKernel(const float4* rows, int tokens, int top_k, int h4, float4* out) {
  GridDependencyWait();  // the rows come from the down projection
  const size_t n = static_cast<size_t>(tokens) * h4;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const size_t t = i / h4, c = i % h4;
    const float4* r = rows + t * top_k * h4 + c;
    float4 sum = r[0];
    for (int k = 1; k < top_k; ++k) {
      const float4 v = r[static_cast<size_t>(k) * h4];
      sum.x += v.x, sum.y += v.y, sum.z += v.z, sum.w += v.w;
    }
    float4 o = out[i];
    o.x += sum.x, o.y += sum.y, o.z += sum.z, o.w += sum.w;
    out[i] = o;
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

cudaError_t LaunchGateUp(dim3 grid, cudaStream_t stream, MoeDeviceWeights w, const __nv_bfloat16* x,
                         int top_k, RouteView route, float limit, float alpha, float* h) {
  const size_t smem = StagingBytes(w.hidden);
  static PerDevice<size_t> allowed;
  cudaError_t err = AllowSharedBytes(GateUpSwigluKernel, smem, &allowed);
  if (err != cudaSuccess) return err;
  GateUpSwigluKernel<<<grid, kThreads, smem, stream>>>(w, x, top_k, route, limit, alpha, h);
  return cudaGetLastError();
}

cudaError_t LaunchDown(dim3 grid, cudaStream_t stream, MoeDeviceWeights w, const float* h,
                       const float* topk_weights, int top_k, RouteView route, float* out) {
  const size_t smem = StagingBytes(w.intermediate);
  static PerDevice<size_t> allowed;
  cudaError_t err = AllowSharedBytes(DownScatterKernel, smem, &allowed);
  if (err != cudaSuccess) return err;
  DownScatterKernel<<<grid, kThreads, smem, stream>>>(w, h, topk_weights, top_k, route, out);
  return cudaGetLastError();
}

template <bool kDown, int kGroups, bool kPrmt, int kBufs>
cudaError_t LaunchMma(int slots, cudaStream_t stream, const MmaArgs& args, bool pdl) {
  const int ksplit = kDown ? args.ksplit : 1;
  const int nbl = (args.nb + ksplit - 1) / ksplit;
  const size_t smem =
      kBufs * (static_cast<size_t>(kTileRows) * (nbl * 16 + 16) + kTileRows * args.nb);
  auto kernel = MoeMmaKernel<kDown, kGroups, kPrmt, kBufs>;
  static PerDevice<size_t> allowed;
  cudaError_t err = AllowSharedBytes(kernel, smem, &allowed);
  if (err != cudaSuccess) return err;
  int grid = slots * (args.rows / kTileRows) * ksplit;
  if (kBufs > 1) {
    // Persistent: as many CTAs as fit at once on this device (each loops
    // over its tiles); host queries, legal inside a stream capture.
    int dev = 0, sms = 0, occ = 0;
    if ((err = cudaGetDevice(&dev)) != cudaSuccess ||
        (err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev)) != cudaSuccess ||
        (err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kernel, kMmaThreads, smem)) !=
            cudaSuccess) {
      return err;
    }
    grid = std::min(grid, std::max(1, occ) * sms);
  }
  return LaunchPdl(kernel, dim3(grid), dim3(kMmaThreads), smem, stream, pdl, args);
}

template <bool kDown, int kGroups, int kBufs>
cudaError_t LaunchMmaBufs(int slots, cudaStream_t stream, const MmaArgs& args,
                          const MoeTuning& t) {
  return t.prmt_decode ? LaunchMma<kDown, kGroups, true, kBufs>(slots, stream, args, t.pdl)
                       : LaunchMma<kDown, kGroups, false, kBufs>(slots, stream, args, t.pdl);
}

template <bool kDown, int kGroups>
cudaError_t LaunchMmaGroups(int slots, cudaStream_t stream, const MmaArgs& args,
                            const MoeTuning& t) {
  switch (t.tile_buffers) {
    case 1:
      return LaunchMmaBufs<kDown, kGroups, 1>(slots, stream, args, t);
    case 3:
      return LaunchMmaBufs<kDown, kGroups, 3>(slots, stream, args, t);
    default:
      return LaunchMmaBufs<kDown, kGroups, 2>(slots, stream, args, t);
  }
}

template <bool kDown>
cudaError_t LaunchMmaProjection(int slots, cudaStream_t stream, const MmaArgs& args, int groups,
                                const MoeTuning& t) {
  if (groups == 2) return LaunchMmaGroups<kDown, 2>(slots, stream, args, t);
  return groups > 1 ? LaunchMmaGroups<kDown, 4>(slots, stream, args, t)
                    : LaunchMmaGroups<kDown, 1>(slots, stream, args, t);
}

// Shared memory of one tile buffer of a projection.
size_t MmaTileBytes(const MmaArgs& a, int ksplit) {
  const int nbl = (a.nb + ksplit - 1) / ksplit;
  return static_cast<size_t>(kTileRows) * (nbl * 16 + 16) + static_cast<size_t>(kTileRows) * a.nb;
}

template <int kGroups, bool kPrmt>
cudaError_t LaunchMmaFused(int slots, cudaStream_t stream, const MmaArgs& gu, const MmaArgs& dn,
                           bool pdl) {
  const size_t smem = std::max(MmaTileBytes(gu, 1), MmaTileBytes(dn, dn.ksplit));
  auto kernel = MoeMmaFusedKernel<kGroups, kPrmt>;
  static PerDevice<size_t> allowed;
  cudaError_t err = AllowSharedBytes(kernel, smem, &allowed);
  if (err != cudaSuccess) return err;
  const int gu_grid = slots * (gu.rows / kTileRows);
  const int dn_grid = slots * (dn.rows / kTileRows) * dn.ksplit;
  return LaunchPdl(kernel, dim3(gu_grid + dn_grid), dim3(kMmaThreads), smem, stream, pdl, gu, dn,
                   gu_grid);
}

template <int kGroups>
cudaError_t LaunchMmaFusedPrmt(int slots, cudaStream_t stream, const MmaArgs& gu, const MmaArgs& dn,
                               const MoeTuning& t) {
  return t.prmt_decode ? LaunchMmaFused<kGroups, true>(slots, stream, gu, dn, t.pdl)
                       : LaunchMmaFused<kGroups, false>(slots, stream, gu, dn, t.pdl);
}

cudaError_t LaunchMmaFusedProjections(int slots, cudaStream_t stream, const MmaArgs& gu,
                                      const MmaArgs& dn, int groups, const MoeTuning& t) {
  if (groups == 2) return LaunchMmaFusedPrmt<2>(slots, stream, gu, dn, t);
  return groups > 1 ? LaunchMmaFusedPrmt<4>(slots, stream, gu, dn, t)
                    : LaunchMmaFusedPrmt<1>(slots, stream, gu, dn, t);
}

bool UseGemm(const MoeTuning& t, int pairs, int num_experts) {
  if (t.legacy_fma || t.gemm_min_pairs_per_expert < 0) return false;
  return static_cast<int64_t>(pairs) >=
         static_cast<int64_t>(t.gemm_min_pairs_per_expert) * num_experts;
}

}  // namespace

bool MoeUsesGemm(int tokens, int top_k, int num_experts, const MoeTuning& tuning) {
  return UseGemm(tuning, tokens * top_k, num_experts);
}

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
    cudaError_t err = cudaMemcpyAsync(c.dst, c.src, c.bytes, cudaMemcpyDefault, stream);
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

cudaError_t UploadMoeExpertSlice(const MoeDeviceWeights& w, int slot, int full_intermediate,
                                 int begin, bool with_down_bias, const uint8_t* gate_up_blocks,
                                 const uint8_t* gate_up_scales, const uint16_t* gate_up_bias,
                                 const uint8_t* down_blocks, const uint8_t* down_scales,
                                 const uint16_t* down_bias, cudaStream_t stream) {
  if (slot < 0 || slot >= w.num_experts || begin < 0 || begin % 32 != 0 ||
      full_intermediate % 32 != 0 || begin + w.intermediate > full_intermediate ||
      gate_up_blocks == nullptr || gate_up_scales == nullptr || gate_up_bias == nullptr ||
      down_blocks == nullptr || down_scales == nullptr ||
      (with_down_bias && down_bias == nullptr)) {
    return cudaErrorInvalidValue;
  }
  const Sizes s = SizesOf(1, w.hidden, w.intermediate);
  const size_t e = static_cast<size_t>(slot), hb = static_cast<size_t>(w.hidden) / 32;
  const size_t row0 = 2 * static_cast<size_t>(begin);  // gate_up rows: gate and up interleaved
  const size_t b0 = static_cast<size_t>(begin) / 32, nb = static_cast<size_t>(w.intermediate) / 32;
  const size_t full_nb = static_cast<size_t>(full_intermediate) / 32;
  cudaError_t err =
      cudaMemcpyAsync(w.gate_up_blocks + e * s.gu_blocks, gate_up_blocks + row0 * hb * 16,
                      s.gu_blocks, cudaMemcpyDefault, stream);
  if (err == cudaSuccess) {
    err = cudaMemcpyAsync(w.gate_up_scales + e * s.gu_scales, gate_up_scales + row0 * hb,
                          s.gu_scales, cudaMemcpyDefault, stream);
  }
  if (err == cudaSuccess) {
    err = cudaMemcpyAsync(reinterpret_cast<uint8_t*>(w.gate_up_bias) + e * s.gu_bias,
                          gate_up_bias + row0, s.gu_bias, cudaMemcpyDefault, stream);
  }
  // down [H, I/32] blocks and scales: a run of nb blocks out of each row's full_nb.
  if (err == cudaSuccess) {
    err = cudaMemcpy2DAsync(w.down_blocks + e * s.d_blocks, nb * 16, down_blocks + b0 * 16,
                            full_nb * 16, nb * 16, w.hidden, cudaMemcpyDefault, stream);
  }
  if (err == cudaSuccess) {
    err = cudaMemcpy2DAsync(w.down_scales + e * s.d_scales, nb, down_scales + b0, full_nb, nb,
                            w.hidden, cudaMemcpyDefault, stream);
  }
  uint8_t* bias = reinterpret_cast<uint8_t*>(w.down_bias) + e * s.d_bias;
  if (err == cudaSuccess) {
    err = with_down_bias ? cudaMemcpyAsync(bias, down_bias, s.d_bias, cudaMemcpyDefault, stream)
                         : cudaMemsetAsync(bias, 0, s.d_bias, stream);
  }
  return err;
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

size_t MoeWorkspaceBytes(const MoeDeviceWeights& w, int tokens, int top_k, bool deterministic) {
  if (tokens <= 0 || top_k <= 0) return 0;
  size_t pairs = static_cast<size_t>(tokens) * top_k;
  size_t e = static_cast<size_t>(w.num_experts);
  // The tensor-core kernels read activation fragments ahead past a row's end
  // (results dropped): kActivationSlack bytes after the last row keep that
  // inside the buffer.
  // h: f32 for the decode kernels, or the GEMM path's bf16 h and tile map.
  const size_t h_bytes =
      std::max(pairs * static_cast<size_t>(w.intermediate) * sizeof(float),
               MoeGemmWorkspaceBytes(w, tokens, top_k));
  // Deterministic: a row per pair for the down projection's outputs.
  const size_t pair_row_bytes = deterministic ? AlignUp(pairs * w.hidden * sizeof(float)) : 0;
  return AlignUp((4 * e + 3) * sizeof(int32_t)) + AlignUp(pairs * sizeof(int32_t)) +
         AlignUp(h_bytes) + pair_row_bytes +
         AlignUp(static_cast<size_t>(tokens) * w.hidden * sizeof(uint16_t)) + kActivationSlack;
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

namespace {

// LaunchMoeLayer's workspace (MoeWorkspaceBytes): the routing, h (or the
// GEMMs' workspace), deterministic mode's pair rows, the f16 copy of x.
struct Workspace {
  MoeRouteTargets route;
  float* h = nullptr;
  float* pair_rows = nullptr;  // deterministic: the down projection's output per pair
};

Workspace CarveWorkspace(const MoeDeviceWeights& w, int tokens, int top_k, bool deterministic,
                         void* workspace, int32_t* invalid_ids) {
  const int E = w.num_experts;
  const size_t pairs = static_cast<size_t>(tokens) * top_k;
  Workspace ws;
  MoeRouteTargets& r = ws.route;
  auto* base = static_cast<uint8_t*>(workspace);
  r.experts = E;
  r.count = reinterpret_cast<int32_t*>(base);
  r.offset = r.count + E;
  r.active = r.offset + E + 1;
  r.num_active = r.active + E;
  r.done = r.num_active + 1;
  r.invalid = invalid_ids;
  base += AlignUp((4 * static_cast<size_t>(E) + 3) * sizeof(int32_t));
  r.pair_of = reinterpret_cast<int32_t*>(base);
  base += AlignUp(pairs * sizeof(int32_t));
  ws.h = reinterpret_cast<float*>(base);
  base += AlignUp(
      std::max(pairs * w.intermediate * sizeof(float), MoeGemmWorkspaceBytes(w, tokens, top_k)));
  if (deterministic) {
    ws.pair_rows = reinterpret_cast<float*>(base);
    base += AlignUp(pairs * w.hidden * sizeof(float));
  }
  r.xh = reinterpret_cast<uint16_t*>(base);
  return ws;
}

// LaunchMoeLayer, and with a diagnostic the benchmarks' split of the decode
// kernels' copies and math (moe_diagnostic.h).
cudaError_t LaunchLayer(const MoeDeviceWeights& w, const uint16_t* x, const int32_t* topk_ids,
                        const float* topk_weights, int tokens, int top_k, float limit, float alpha,
                        float* out, void* workspace, size_t workspace_bytes, int32_t* invalid_ids,
                        cudaStream_t stream, bool deterministic, const MoeTuning& tuning,
                        MoeDiagnostic diagnostic, bool routed) {
  if (!ShapeOk(w.num_experts, w.hidden, w.intermediate) || tokens < 0 || top_k <= 0 ||
      top_k > w.num_experts) {
    return cudaErrorInvalidValue;
  }
  if (tokens == 0) return cudaSuccess;
  if (x == nullptr || topk_ids == nullptr || topk_weights == nullptr || out == nullptr ||
      workspace == nullptr ||
      workspace_bytes < MoeWorkspaceBytes(w, tokens, top_k, deterministic) ||
      reinterpret_cast<uintptr_t>(workspace) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(x) % 16 != 0 || reinterpret_cast<uintptr_t>(out) % 16 != 0 ||
      static_cast<int64_t>(tokens) * top_k > (int64_t{1} << 30)) {
    return cudaErrorInvalidValue;
  }
  const int E = w.num_experts, pairs = tokens * top_k;
  const Workspace ws = CarveWorkspace(w, tokens, top_k, deterministic, workspace, invalid_ids);
  const MoeRouteTargets& rt = ws.route;
  int32_t *count = rt.count, *offset = rt.offset, *pair_of = rt.pair_of, *active = rt.active,
          *num_active = rt.num_active, *done = rt.done;
  float* h = ws.h;
  float* pair_rows = ws.pair_rows;
  uint16_t* xh = rt.xh;
  const int H = w.hidden, I = w.intermediate;
  // At most min(E, pairs) experts are touched: that bounds the grid's second axis.
  const unsigned slots = static_cast<unsigned>(std::min(E, pairs));

  // Deterministic: each pair's output in its own zeroed row (at most two
  // writers per value, and a + b == b + a), then summed per token in choice
  // order; else added into `out` with atomics in the order CTAs finish.
  if (deterministic) {
    cudaError_t err =
        cudaMemsetAsync(pair_rows, 0, static_cast<size_t>(pairs) * H * sizeof(float), stream);
    if (err != cudaSuccess) return err;
  }
  auto sum_pair_rows = [&](cudaError_t err) {
    if (err != cudaSuccess || !deterministic) return err;
    const int h4 = H / 4;
    const size_t n = static_cast<size_t>(tokens) * h4;
    return LaunchPdl(SumPairRowsKernel,
                     dim3(static_cast<unsigned>(std::min<size_t>((n + 255) / 256, 1024))),
                     dim3(256), 0, stream, tuning.pdl, reinterpret_cast<const float4*>(pair_rows),
                     tokens, top_k, h4, reinterpret_cast<float4*>(out));
  };
  if (diagnostic == MoeDiagnostic::kNone && UseGemm(tuning, pairs, E)) {
    // Routing only (one block, no activation conversion), then the GEMMs.
    if (!routed) {
      const cudaError_t err =
          LaunchPdl(RoutePrepKernel, dim3(1), dim3(kRouteThreads), 0, stream, tuning.pdl, topk_ids,
                    pairs, rt, reinterpret_cast<const uint4*>(x), size_t{0});
      if (err != cudaSuccess) return err;
    }
    const int rows_per_tile = tuning.gemm_rows_per_tile != 0 ? tuning.gemm_rows_per_tile
                              : tuning.gemm_160_rows && MoeGemmPrefers160Rows(pairs, E) ? 160
                              : pairs >= 64 * E                                         ? 128
                              : pairs >= 24 * E                                         ? 64
                                                                                        : 32;
    MoeGemmOptions o;
    o.rows_per_tile = rows_per_tile, o.remainder_tiles = tuning.gemm_remainder_tiles;
    o.wgmma = tuning.gemm_wgmma, o.out_per_pair = deterministic;
    o.h_low_part =
        static_cast<int64_t>(pairs) < static_cast<int64_t>(tuning.gemm_h_low_part_below_pairs) * E;
    o.tma = tuning.gemm_tma, o.two_streams = tuning.gemm_two_streams;
    return sum_pair_rows(LaunchMoeGemm(w, x, topk_weights, tokens, top_k, limit, alpha,
                                       MoeGemmRoute{count, offset, pair_of},
                                       deterministic ? pair_rows : out, h, o, stream));
  }
  if (!tuning.legacy_fma || diagnostic != MoeDiagnostic::kNone) {
    const size_t x_vecs = static_cast<size_t>(tokens) * H / 8;
    const unsigned prep_blocks =
        1 + static_cast<unsigned>(std::min<size_t>((x_vecs + kRouteThreads - 1) / kRouteThreads,
                                                   1024));
    cudaError_t err = cudaSuccess;
    if (!routed) {
      err = LaunchPdl(RoutePrepKernel, dim3(prep_blocks), dim3(kRouteThreads), 0, stream,
                      tuning.pdl, topk_ids, pairs, rt, reinterpret_cast<const uint4*>(x), x_vecs);
      if (err != cudaSuccess) return err;
    }
    RouteView route{offset, pair_of, active, num_active};
    // Several groups of 8 columns per weight decode once experts average
    // 8 or more tokens (H200, 120b, 1 / 2 / 4 groups: 256 tokens 1188 / 1168
    // / 1531 us, 384 tokens 1550 / 1435 / 1817, 64 tokens 654 / 806 / 1087).
    const int64_t per_expert = static_cast<int64_t>(pairs) / E;
    const int groups = tuning.decode_groups > 0 ? tuning.decode_groups
                       : per_expert >= 16        ? 4
                       : per_expert >= 8         ? 2
                                                 : 1;
    MmaArgs gu{};
    gu.ksplit = 1;
    gu.evict_first = tuning.evict_first;
    gu.blocks = w.gate_up_blocks, gu.scales = w.gate_up_scales, gu.bias = w.gate_up_bias;
    gu.rows = 2 * I, gu.nb = H / 32, gu.act = reinterpret_cast<const uint4*>(xh);
    gu.route = route, gu.top_k = top_k, gu.limit = limit, gu.alpha = alpha;
    gu.h_out = reinterpret_cast<uint16_t*>(h);
    gu.copy_only = diagnostic == MoeDiagnostic::kCopyOnly;
    gu.math_only = diagnostic == MoeDiagnostic::kMathOnly;
    MmaArgs dn{};
    dn.blocks = w.down_blocks, dn.scales = w.down_scales, dn.bias = w.down_bias;
    dn.rows = H, dn.nb = I / 32, dn.act = reinterpret_cast<const uint4*>(h);
    dn.route = route, dn.top_k = top_k, dn.topk_weights = topk_weights, dn.out = out;
    dn.evict_first = tuning.evict_first;
    dn.copy_only = gu.copy_only;
    dn.math_only = gu.math_only;
    dn.pair_rows = pair_rows;
    // Deterministic: at most two writers per value (see above).
    dn.ksplit = std::max(
        1,
        std::min(deterministic ? std::min(2, tuning.down_split_k) : tuning.down_split_k, I / 32));
    if (tokens <= tuning.fuse_projections_max_tokens && tuning.tile_buffers == 1 &&
        diagnostic == MoeDiagnostic::kNone) {
      gu.done = dn.done = done;
      gu.gu_tiles = dn.gu_tiles = gu.rows / kTileRows;
      return sum_pair_rows(
          LaunchMmaFusedProjections(static_cast<int>(slots), stream, gu, dn, groups, tuning));
    }
    err = LaunchMmaProjection<false>(static_cast<int>(slots), stream, gu, groups, tuning);
    if (err != cudaSuccess) return err;
    return sum_pair_rows(
        LaunchMmaProjection<true>(static_cast<int>(slots), stream, dn, groups, tuning));
  }

  cudaError_t err = LaunchMoeRoute(topk_ids, pairs, E, count, offset, pair_of, active, num_active,
                                   invalid_ids, stream);
  if (err != cudaSuccess) return err;
  RouteView route{offset, pair_of, active, num_active};
  dim3 gu_grid((2 * I + kRowsPerBlock - 1) / kRowsPerBlock, slots);
  err = LaunchGateUp(gu_grid, stream, w, reinterpret_cast<const __nv_bfloat16*>(x), top_k, route,
                     limit, alpha, h);
  if (err != cudaSuccess) return err;
  dim3 down_grid((H + kRowsPerBlock - 1) / kRowsPerBlock, slots);
  // The CUDA-core baseline adds into `out` directly, deterministic or not.
  return LaunchDown(down_grid, stream, w, static_cast<const float*>(h), topk_weights, top_k, route,
                    out);
}

}  // namespace

cudaError_t LaunchMoeLayer(const MoeDeviceWeights& w, const uint16_t* x, const int32_t* topk_ids,
                           const float* topk_weights, int tokens, int top_k, float limit,
                           float alpha, float* out, void* workspace, size_t workspace_bytes,
                           int32_t* invalid_ids, cudaStream_t stream, bool deterministic,
                           const MoeTuning& tuning, bool routed) {
  return LaunchLayer(w, x, topk_ids, topk_weights, tokens, top_k, limit, alpha, out, workspace,
                     workspace_bytes, invalid_ids, stream, deterministic, tuning,
                     MoeDiagnostic::kNone, routed);
}

MoeRouteTargets MoeRouteTargetsIn(const MoeDeviceWeights& w, int tokens, int top_k,
                                  bool deterministic, void* workspace, int32_t* invalid_ids) {
  return CarveWorkspace(w, tokens, top_k, deterministic, workspace, invalid_ids).route;
}

cudaError_t LaunchMoeLayerDiagnostic(const MoeDeviceWeights& w, const uint16_t* x,
                                     const int32_t* topk_ids, const float* topk_weights, int tokens,
                                     int top_k, float limit, float alpha, float* out,
                                     void* workspace, size_t workspace_bytes, cudaStream_t stream,
                                     const MoeTuning& tuning, MoeDiagnostic diagnostic) {
  return LaunchLayer(w, x, topk_ids, topk_weights, tokens, top_k, limit, alpha, out, workspace,
                     workspace_bytes, nullptr, stream, /*deterministic=*/false, tuning, diagnostic,
                     /*routed=*/false);
}

}  // namespace flotilla::kernels::cuda
