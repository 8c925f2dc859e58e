// The MoE decode sizes on FP8 warpgroup MMA (moe_w4a8.h has the layouts and
// the numerics).
//
// A CTA is one warpgroup owning a slab: 64 weight rows of one touched expert
// over a share of the reduction. Its weights land in shared memory by bulk
// copies (one mbarrier) while it builds the B operand (the expert's tokens'
// e4m3 parts, K-major, no swizzle: for each block, 8-column groups 256 bytes
// apart, the two 16-value k halves 128 apart). Each warp then decodes its 16
// rows (rows g and g + 8 of lane (g, q)) four blocks at a time into wgmma's A
// registers, issues the four m64n8k32 e4m3 wgmmas, waits, and adds each
// block's sums into f32 registers times its activation scales. The weights'
// re-layout is in moe_w4a8_relay.cu.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <algorithm>

#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/moe_diagnostic.h"
#include "kernels/cuda/moe_route.cuh"
#include "kernels/cuda/moe_w4a8.h"
#include "kernels/cuda/ptx.cuh"

namespace flotilla::kernels::cuda {
namespace {

using ptx::MbarExpectTx;
using ptx::MbarInit;
using ptx::MbarWait;
using ptx::SharedAddress;

constexpr int kThreads = 128;  // one warpgroup
constexpr int kTileRows = kMoeW4a8TileRows;
constexpr int kStage = 4;        // blocks decoded, then multiplied, per wait
constexpr int kTileStride = 17;  // floats per row of the sums' staging tile
constexpr int kPrepThreads = 1024;
constexpr int kMaxExperts = kMoeW4a8MaxExperts;
// A weight's e4m3 code carries 2^(k - 8) (k = s - S + 14), so the value is
// code * 2^(S - 127 - 14 + 8).
constexpr int kRowExpBias = 133;

size_t AlignUp(size_t v) { return (v + 255) & ~size_t{255}; }

// ------------------------------------------------------------ numerics

// The e4m3 codes of the 8 e2m1 magnitudes times 2^(k - 8) (k 15: zeros),
// bytes 0..7 of the pair.
__device__ __forceinline__ uint2 LookupEntry(int k) {
  const float mag[8] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};
  uint32_t v[2] = {0, 0};
  if (k < 15) {
#pragma unroll
    for (int m = 1; m < 8; ++m) {
      const uint32_t c = __nv_cvt_float_to_fp8(ldexpf(mag[m], k - 8), __NV_SATFINITE, __NV_E4M3);
      v[m >> 2] |= c << (8 * (m & 3));
    }
  }
  return make_uint2(v[0], v[1]);
}

// A re-laid word -> the e4m3 registers of its k 4q..4q+3 (r0) and
// 16+4q..16+4q+3 (r1), through the row's lookup (l0, l1).
__device__ __forceinline__ void DecodeWord(uint32_t w, uint2 l, uint32_t& r0, uint32_t& r1) {
  r0 = __byte_perm(l.x, l.y, w & 0x7777u) | (w & 0x80808080u);
  r1 = __byte_perm(l.x, l.y, (w >> 16) & 0x7777u) | ((w << 4) & 0x80808080u);
}

// v (scaled so |v| <= 448) as kParts e4m3 codes whose sum is v to ~4 bits
// each: the high part rounded, then each remainder.
template <int kParts>
__device__ __forceinline__ void SplitE4m3(float v, uint8_t (&c)[kParts]) {
#pragma unroll
  for (int i = 0; i < kParts; ++i) {
    const __nv_fp8_storage_t code = __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
    c[i] = code;
    const __half_raw hr = __nv_cvt_fp8_to_halfraw(code, __NV_E4M3);
    v -= __half2float(__half(hr));
  }
}

// 2^a with the row's largest |v| * 2^a in (224, 448] (1 for a zero row).
__device__ __forceinline__ float RowScale(float largest) {
  if (!(largest > 0.f)) return 1.f;
  int e = 0;
  const float m = frexpf(largest, &e);  // largest = m 2^e, m in [0.5, 1)
  return ldexpf(1.f, (m <= 0.875f ? 9 : 8) - e);
}

// d = a (64 x 32 e4m3, registers) * B (32 x kN e4m3, `desc`), replacing d.
template <int kN>
__device__ __forceinline__ void Wgmma(float (&d)[kN / 2], const uint32_t (&a)[4], uint64_t desc) {
  if constexpr (kN == 8) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, 0, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "%8, p, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
  } else {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, 0, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n16k32.f32.e4m3.e4m3 {%0, %1, %2, %3, %4, %5, %6, %7}, "
        "{%8, %9, %10, %11}, %12, p, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
          "+f"(d[7])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
  }
}

// Keeps the compiler from moving register writes or reads across a wgmma
// fence or wait (ptx.cuh, FenceWgmmaTile).
template <int kN>
__device__ __forceinline__ void FenceSums(float (&d)[kN / 2]) {
#pragma unroll
  for (int c = 0; c < kN / 2; ++c) asm volatile("" : "+f"(d[c])::"memory");
}

// B of block b: K-major without swizzle, 8-row core matrices of 16 bytes;
// the k halves 128 bytes apart (leading offset), 8-column groups 256 apart.
__device__ __forceinline__ uint64_t DescB(const void* p) {
  const uint64_t a = SharedAddress(p);
  return ((a & 0x3FFFFu) >> 4) | (uint64_t{128 >> 4} << 16) | (uint64_t{256 >> 4} << 32);
}

// The slab's sums into `tile` [64][kTileStride] (row, column; it overlays
// B: called by the whole CTA). Each stage of kStage blocks is decoded first
// (ptxas serializes wgmmas whose inputs are written while one is in
// flight), then each block's wgmma goes into zeroed registers of its own and
// is added into f32 times its columns' activation scales `bscale` [nbp][kN]
// (a block's activation scale per column; FP8 MMA also keeps fewer bits
// than f32 across blocks).
template <int kN>
__device__ __forceinline__ void SlabMath(const uint8_t* slab, int nbp, const uint8_t* sb,
                                         const float* bscale, const uint2* lut, float* tile) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
  const int r0 = 16 * warp + g, r1 = r0 + 8;
  const uint32_t* words = reinterpret_cast<const uint32_t*>(slab);
  const uint8_t* ks = slab + static_cast<size_t>(kTileRows) * nbp * 16;
  constexpr int kBBytes = kN / 8 * 256;
  float acc[kN / 2];
#pragma unroll
  for (int i = 0; i < kN / 2; ++i) acc[i] = 0.f;
  auto decode = [&](uint32_t(&f)[4], int b) {
    const uint2 l0 = lut[ks[b * kTileRows + r0]], l1 = lut[ks[b * kTileRows + r1]];
    DecodeWord(words[(b * kTileRows + r0) * 4 + q], l0, f[0], f[2]);
    DecodeWord(words[(b * kTileRows + r1) * 4 + q], l1, f[1], f[3]);
  };
  float d[kStage][kN / 2];  // each block's sums (replaced by its wgmma)
#pragma unroll
  for (int i = 0; i < kStage; ++i) {
#pragma unroll
    for (int c = 0; c < kN / 2; ++c) d[i][c] = 0.f;
  }
  auto run = [&](auto count_tag, int b) {
    constexpr int kCount = decltype(count_tag)::value;
    uint32_t a[kCount][4];
#pragma unroll
    for (int i = 0; i < kCount; ++i) {
      decode(a[i], b + i);
      ptx::FenceWgmmaFragment(a[i]);
      FenceSums<kN>(d[i]);
    }
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
    for (int i = 0; i < kCount; ++i) Wgmma<kN>(d[i], a[i], DescB(sb + (b + i) * kBBytes));
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#pragma unroll
    for (int i = 0; i < kCount; ++i) {
      FenceSums<kN>(d[i]);
      ptx::FenceWgmmaFragment(a[i]);
    }
#pragma unroll
    for (int i = 0; i < kCount; ++i) {
#pragma unroll
      for (int jj = 0; jj < kN / 8; ++jj) {
        const float2 sc = *reinterpret_cast<const float2*>(bscale + (b + i) * kN + 8 * jj + 2 * q);
        acc[4 * jj + 0] = fmaf(d[i][4 * jj + 0], sc.x, acc[4 * jj + 0]);
        acc[4 * jj + 1] = fmaf(d[i][4 * jj + 1], sc.y, acc[4 * jj + 1]);
        acc[4 * jj + 2] = fmaf(d[i][4 * jj + 2], sc.x, acc[4 * jj + 2]);
        acc[4 * jj + 3] = fmaf(d[i][4 * jj + 3], sc.y, acc[4 * jj + 3]);
      }
    }
  };
  int b = 0;
#pragma unroll 1
  for (; b + kStage <= nbp; b += kStage) run(std::integral_constant<int, kStage>{}, b);
#pragma unroll 1
  for (; b < nbp; ++b) run(std::integral_constant<int, 1>{}, b);
  // The tile overlays B: every warp's wgmmas must be done with it.
  __syncthreads();
  // Accumulator i of 8-column group jj: row g (i < 2) or g + 8, column
  // 8 jj + 2q + (i & 1).
#pragma unroll
  for (int jj = 0; jj < kN / 8; ++jj) {
    const int c = 8 * jj + 2 * q;
    tile[r0 * kTileStride + c] = acc[4 * jj + 0];
    tile[r0 * kTileStride + c + 1] = acc[4 * jj + 1];
    tile[r1 * kTileStride + c] = acc[4 * jj + 2];
    tile[r1 * kTileStride + c + 1] = acc[4 * jj + 3];
  }
}

// ------------------------------------------------------------ the layer

struct LayerArgs {
  MoeW4a8Projection gu, dn;
  int hidden, intermediate, top_k, pairs, gu_grid;
  float limit, alpha;
  MoeRouteTargets route;
  int32_t* tile_done;      // [slots][gu row tiles]: gate_up parts finished
  const uint8_t* xq;       // [tokens][H / 32][2][32] e4m3 parts of x, per block scaled
  const float* x_unscale;  // [tokens][H / 32] the blocks' 2^-a
  const float* topk_weights;
  float* gu_part;    // [gu parts][pairs][2I]
  uint8_t* hq;       // [pairs][I / 32][3][32] e4m3 parts of h, per block scaled
  float* h_unscale;  // [pairs][I / 32]
  float* out;
  size_t b_offset, scale_offset, lut_offset;  // in dynamic shared memory
  unsigned skip;  // benchmarks only: MoeW4a8Skip bits (moe_diagnostic.h)
};

__device__ __forceinline__ int AtomicAddAcqRel(int32_t* p, int v) {
  int old;
  asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], %2;"
               : "=r"(old)
               : "l"(p), "r"(v)
               : "memory");
  return old;
}

__device__ __forceinline__ float LoadL2(const float* p) { return __ldcg(p); }

// Routing (block 0), each token's x as high and low e4m3 parts under a
// scale per 32-value block (blocks 1..T), the gate_up tiles' counters
// zeroed (the rest).
__global__ void __launch_bounds__(kPrepThreads)
    PrepKernel(const int32_t* ids, int pairs, MoeRouteTargets route, const uint16_t* x, int tokens,
               int hidden, uint8_t* xq, float* x_unscale, int32_t* tile_done, int tile_counters) {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  const int b = static_cast<int>(blockIdx.x);
  if (b == 0) {
    BuildMoeRouting<kMaxExperts>(ids, pairs, route);
    return;
  }
  if (b > tokens) {
    for (int i = (b - tokens - 1) * kPrepThreads + threadIdx.x; i < tile_counters;
         i += (gridDim.x - tokens - 1) * kPrepThreads) {
      tile_done[i] = 0;
    }
    return;
  }
  // Thread i: values 8i..8i+7 of token t; the four threads of a block
  // agree on its scale.
  const int t = b - 1, groups = hidden / 8, i = threadIdx.x;
  float v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  float top = 0.f;
  if (i < groups) {  // hidden <= 8192: one pass
    const uint4 raw = reinterpret_cast<const uint4*>(x + static_cast<size_t>(t) * hidden)[i];
    const uint32_t u[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      v[2 * k] = __uint_as_float(u[k] << 16);
      v[2 * k + 1] = __uint_as_float(u[k] & 0xFFFF0000u);
    }
#pragma unroll
    for (int k = 0; k < 8; ++k) top = fmaxf(top, fabsf(v[k]));
  }
  top = fmaxf(top, __shfl_xor_sync(0xFFFFFFFFu, top, 1));
  top = fmaxf(top, __shfl_xor_sync(0xFFFFFFFFu, top, 2));
  if (i >= groups) return;
  const float scale = RowScale(top);
  const int blk = i / 4, off = (i % 4) * 8;
  if (off == 0) x_unscale[static_cast<size_t>(t) * (hidden / 32) + blk] = 1.f / scale;
  uint32_t hi[2] = {0, 0}, lo[2] = {0, 0};
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    uint8_t c[2];
    SplitE4m3<2>(v[k] * scale, c);
    hi[k >> 2] |= static_cast<uint32_t>(c[0]) << (8 * (k & 3));
    lo[k >> 2] |= static_cast<uint32_t>(c[1]) << (8 * (k & 3));
  }
  uint8_t* base = xq + (static_cast<size_t>(t) * (hidden / 32) + blk) * 64;
  *reinterpret_cast<uint2*>(base + off) = make_uint2(hi[0], hi[1]);
  *reinterpret_cast<uint2*>(base + 32 + off) = make_uint2(lo[0], lo[1]);
}

// A tile's place: expert slot, row tile, reduction part.
struct TilePos {
  int slot, row_tile, part;
};
__device__ __forceinline__ TilePos PosOf(const MoeW4a8Projection& p, int t) {
  const int per_expert = p.row_tiles * p.parts, within = t % per_expert;
  return {t / per_expert, within / p.parts, within % p.parts};
}

// Issues the slab's bulk copies (warp 0) on `bar`, which expects its bytes.
__device__ __forceinline__ void CopySlab(const MoeW4a8Projection& p, int e, const TilePos& x,
                                         uint8_t* dst, uint64_t* bar, unsigned a_skip) {
  const uint8_t* src =
      p.slabs +
      ((static_cast<size_t>(e) * p.row_tiles + x.row_tile) * p.parts + x.part) * p.slab_bytes;
  const bool skip = (a_skip & kW4a8SkipCopies) != 0;
  if (threadIdx.x == 0) MbarExpectTx(bar, skip ? 0u : static_cast<uint32_t>(p.slab_bytes));
  if (skip) {  // lookup indices in range, whatever the weights hold
    const int nbp = p.blocks / p.parts;
    for (int i = threadIdx.x; i < kTileRows * nbp; i += kThreads) dst[kTileRows * nbp * 16 + i] = 0;
    return;
  }
  __syncwarp();
  constexpr size_t kPiece = 8 * 1024;
  if (threadIdx.x < 32) {
    uint64_t policy;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
    for (size_t off = threadIdx.x * kPiece; off < p.slab_bytes; off += 32 * kPiece) {
      const uint32_t bytes = static_cast<uint32_t>(min(kPiece, p.slab_bytes - off));
      asm volatile(
          "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
          " [%0], [%1], %2, [%3], %4;" ::"r"(SharedAddress(dst + off)),
          "l"(src + off), "r"(bytes), "r"(SharedAddress(bar)), "l"(policy)
          : "memory");
    }
  }
}

__device__ __forceinline__ float RowFactor(const MoeW4a8Projection& p, int e, int row) {
  const int s = p.row_exp[static_cast<size_t>(e) * p.row_tiles * kTileRows + row];
  return s == 0 ? 0.f : ldexpf(1.f, s - kRowExpBias);
}

// Expert pairs per pass over a slab: a slab's weights stay in shared memory
// while B is rebuilt for each group (more than 4 only when a token names one
// expert several times).
constexpr int kGroup = 4;
// Down: three columns a pair, so two pairs fill n8.
constexpr int kDownGroup = 2;

// B and its scales for one pass: column c (< 8) of block b is part c %
// kParts of pair c / kParts (< ng) from `parts` ([pair][block][kParts][32]
// bytes, `pair_of(j)` the row of the pass's pair j; `unscale` the same
// [pair][block]), else zero. Each thread's loads go out together, then its
// stores.
template <int kParts, typename PairRow>
__device__ __forceinline__ void LoadB(const uint8_t* parts, const float* unscale, int blocks,
                                      int kb0, int nbp, int ng, PairRow pair_row, uint8_t* sb,
                                      float* bscale) {
  constexpr int kAhead = 4;
  for (int u0 = 0; u0 < nbp * 16; u0 += kAhead * kThreads) {
    uint4 v[kAhead];
#pragma unroll
    for (int k = 0; k < kAhead; ++k) {
      const int u = u0 + k * kThreads + threadIdx.x, b = u / 16, c = u & 7, j = c / kParts;
      v[k] = make_uint4(0, 0, 0, 0);
      if (u < nbp * 16 && j < ng) {
        v[k] = *reinterpret_cast<const uint4*>(
            parts +
            ((static_cast<size_t>(pair_row(j)) * blocks + kb0 + b) * kParts + c % kParts) * 32 +
            ((u / 8) & 1) * 16);
      }
    }
#pragma unroll
    for (int k = 0; k < kAhead; ++k) {
      const int u = u0 + k * kThreads + threadIdx.x;
      if (u < nbp * 16) {
        *reinterpret_cast<uint4*>(sb + (u / 16) * 256 + ((u / 8) & 1) * 128 + (u & 7) * 16) = v[k];
      }
    }
  }
  for (int u = threadIdx.x; u < nbp * 8; u += kThreads) {
    const int b = u / 8, j = (u % 8) / kParts;
    bscale[u] = j < ng ? unscale[static_cast<size_t>(pair_row(j)) * blocks + kb0 + b] : 0.f;
  }
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // B is read by wgmma
}

// A pass's product, once B and its scales are in place: the slab has
// landed (waited for on the first pass) and the sums go to the tile, which
// overlays B.
__device__ __forceinline__ void PassMath(const LayerArgs& a, uint64_t* bar, bool first,
                                         uint8_t* smem, int nbp, const uint2* lut) {
  __syncthreads();
  if (first) MbarWait(bar, 0);
  const uint8_t* sb = smem + a.b_offset;
  if ((a.skip & kW4a8SkipMath) == 0) {
    SlabMath<8>(smem, nbp, sb, reinterpret_cast<const float*>(smem + a.scale_offset), lut,
                reinterpret_cast<float*>(smem + a.b_offset));
  }
  __syncthreads();
}

// gate_up tile: x's parts as B, the tile's partial sums to gu_part; the last
// part of a row tile adds the parts, the bias and SwiGLU into h's parts (a
// row tile's 32 features are one block of down's reduction) and counts the
// tile done for its expert.
__device__ void GateUpTile(const LayerArgs& a, int t, uint8_t* smem, uint64_t* bar) {
  const TilePos x = PosOf(a.gu, t);
  if (x.slot >= *a.route.num_active) return;
  const int e = a.route.active[x.slot], n = a.route.count[e], off = a.route.offset[e];
  const int nbp = a.gu.blocks / a.gu.parts, I = a.intermediate;
  CopySlab(a.gu, e, x, smem, bar, a.skip);
  __shared__ int s_tok[kGroup];
  __shared__ bool s_last;
  uint2* lut = reinterpret_cast<uint2*>(smem + a.lut_offset);
  if (threadIdx.x < 16) lut[threadIdx.x] = LookupEntry(threadIdx.x);
  uint8_t* sb = smem + a.b_offset;
  float* bscale = reinterpret_cast<float*>(smem + a.scale_offset);
  float* tile = reinterpret_cast<float*>(sb);
  for (int j0 = 0; j0 < n; j0 += kGroup) {
    const int ng = min(kGroup, n - j0);
    __syncthreads();  // the last group's tile is read
    if (threadIdx.x < ng) s_tok[threadIdx.x] = a.route.pair_of[off + j0 + threadIdx.x] / a.top_k;
    __syncthreads();
    LoadB<2>(
        a.xq, a.x_unscale, a.gu.blocks, x.part * nbp, nbp, ng, [&](int j) { return s_tok[j]; }, sb,
        bscale);
    PassMath(a, bar, j0 == 0, smem, nbp, lut);
    for (int i = threadIdx.x; i < kTileRows * ng; i += kThreads) {
      const int r = i % kTileRows, j = i / kTileRows, row = x.row_tile * kTileRows + r;
      const float sum = tile[r * kTileStride + 2 * j] + tile[r * kTileStride + 2 * j + 1];
      a.gu_part[(static_cast<size_t>(x.part) * a.pairs + off + j0 + j) * 2 * I + row] =
          sum * RowFactor(a.gu, e, row);
    }
  }
  if (n == 0) MbarWait(bar, 0);  // never leave with a copy in flight
  __syncthreads();
  // The parts meet at a counter: the CTA barrier orders every thread's
  // stores before thread 0's release, whose acquire half (for the last part)
  // orders the reads below after the other parts' releases.
  int32_t* counter = a.tile_done + x.slot * a.gu.row_tiles + x.row_tile;
  if (threadIdx.x == 0) s_last = AtomicAddAcqRel(counter, 1) == a.gu.parts - 1;
  __syncthreads();
  if (!s_last) return;
  // Warp w: pairs w, w + 4, ..., its lane one of the row tile's 32 features
  // (rows 2f gate, 2f + 1 up), which are block `row_tile` of h.
  const int lane = threadIdx.x & 31, f = x.row_tile * (kTileRows / 2) + lane;
  const uint16_t* bias = a.gu.bias + static_cast<size_t>(e) * 2 * I;
  const float gate_bias = __bfloat162float(__ushort_as_bfloat16(bias[2 * f]));
  const float up_bias = __bfloat162float(__ushort_as_bfloat16(bias[2 * f + 1]));
  for (int j = threadIdx.x >> 5; j < n; j += kThreads / 32) {
    float gate = gate_bias, up = up_bias;
    for (int p = 0; p < a.gu.parts; ++p) {
      const float* part = a.gu_part + (static_cast<size_t>(p) * a.pairs + off + j) * 2 * I;
      gate += LoadL2(part + 2 * f);
      up += LoadL2(part + 2 * f + 1);
    }
    gate = fminf(gate, a.limit);
    up = fminf(fmaxf(up, -a.limit), a.limit);
    const float hv = (up + 1.f) * (gate / (1.f + __expf(-gate * a.alpha)));
    float m = fabsf(hv);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, o));
    const float scale = RowScale(m);
    uint8_t code[3];
    SplitE4m3<3>(hv * scale, code);
    const size_t block = static_cast<size_t>(off + j) * (I / 32) + x.row_tile;
    uint8_t* dst = a.hq + block * 96 + lane;
#pragma unroll
    for (int pi = 0; pi < 3; ++pi) dst[pi * 32] = code[pi];
    if (lane == 0) a.h_unscale[block] = 1.f / scale;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    ptx::ReleaseAdd(a.route.done + x.slot);
  }
}

// down tile: its weights copied while it waits for its expert's h, then
// per pass of up to kDownGroup pairs: h's three parts as B (columns
// 3j..3j+2), weight * (sums + bias) added into `out`.
__device__ void DownTile(const LayerArgs& a, int t, uint8_t* smem, uint64_t* bar) {
  const TilePos x = PosOf(a.dn, t);
  if (x.slot >= *a.route.num_active) return;
  const int e = a.route.active[x.slot], n = a.route.count[e], off = a.route.offset[e];
  const int nbp = a.dn.blocks / a.dn.parts;
  CopySlab(a.dn, e, x, smem, bar, a.skip);
  uint2* lut = reinterpret_cast<uint2*>(smem + a.lut_offset);
  if (threadIdx.x < 16) lut[threadIdx.x] = LookupEntry(threadIdx.x);
  if (threadIdx.x == 0 && (a.skip & kW4a8SkipWait) == 0) {
    ptx::WaitAtLeast(a.route.done + x.slot, a.gu.row_tiles);
  }
  uint8_t* sb = smem + a.b_offset;
  float* bscale = reinterpret_cast<float*>(smem + a.scale_offset);
  float* tile = reinterpret_cast<float*>(sb);
  for (int j0 = 0; j0 < n; j0 += kDownGroup) {
    const int ng = min(kDownGroup, n - j0);
    __syncthreads();  // the wait above, or the last pass's reads of the tile
    LoadB<3>(
        a.hq, a.h_unscale, a.dn.blocks, x.part * nbp, nbp, ng, [&](int j) { return off + j0 + j; },
        sb, bscale);
    PassMath(a, bar, j0 == 0, smem, nbp, lut);
    for (int i = threadIdx.x; i < kTileRows * ng; i += kThreads) {
      const int r = i % kTileRows, j = i / kTileRows, row = x.row_tile * kTileRows + r;
      if (row >= a.hidden) continue;
      const float* sums = tile + r * kTileStride + 3 * j;
      float v = (sums[0] + sums[1] + sums[2]) * RowFactor(a.dn, e, row);
      if (x.part == 0) {
        v += __bfloat162float(
            __ushort_as_bfloat16(a.dn.bias[static_cast<size_t>(e) * a.hidden + row]));
      }
      const int pair = a.route.pair_of[off + j0 + j];
      atomicAdd(a.out + static_cast<size_t>(pair / a.top_k) * a.hidden + row,
                a.topk_weights[pair] * v);
    }
  }
  if (n == 0) MbarWait(bar, 0);
}

// gate_up tiles first (CTAs [0, gu_grid)), then down's: a down tile waits
// only for gate_up tiles, which wait on nothing and, with lower indices,
// are dispatched first, so the wait ends.
__global__ void __launch_bounds__(kThreads) MoeW4a8Kernel(LayerArgs a) {
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ __align__(8) uint64_t bar;
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  if (threadIdx.x == 0) MbarInit(&bar, 1);
  __syncthreads();
  const int b = static_cast<int>(blockIdx.x);
  if (b < a.gu_grid) {
    GateUpTile(a, b, smem, &bar);
  } else {
    DownTile(a, b - a.gu_grid, smem, &bar);
  }
}

struct Layout {
  size_t route_ints, tile_done, xq, x_unscale, gu_part, hq, h_unscale, total;
};

Layout LayoutOf(const MoeW4a8Weights& w, int tokens, int top_k) {
  const size_t E = w.num_experts, pairs = static_cast<size_t>(tokens) * top_k;
  const size_t slots = std::min(E, pairs), gu_rt = w.gate_up.row_tiles;
  const size_t xb = w.hidden / 32, hb = w.intermediate / 32;
  Layout l{};
  size_t at = 0;
  auto take = [&](size_t bytes) {
    const size_t here = at;
    at += AlignUp(bytes);
    return here;
  };
  l.route_ints = take((5 * E + 4 + pairs) * sizeof(int32_t));
  l.tile_done = take(slots * gu_rt * sizeof(int32_t));
  l.xq = take(static_cast<size_t>(tokens) * xb * 64);
  l.x_unscale = take(static_cast<size_t>(tokens) * xb * sizeof(float));
  l.gu_part = take(static_cast<size_t>(w.gate_up.parts) * pairs * 2 * w.intermediate * 4);
  l.hq = take(pairs * hb * 96);
  l.h_unscale = take(pairs * hb * sizeof(float));
  l.total = at;
  return l;
}

}  // namespace

size_t MoeW4a8WorkspaceBytes(const MoeW4a8Weights& w, int tokens, int top_k) {
  return LayoutOf(w, tokens, top_k).total;
}

namespace {

cudaError_t LaunchLayer(const MoeW4a8Weights& w, const uint16_t* x, const int32_t* topk_ids,
                        const float* topk_weights, int tokens, int top_k, float limit, float alpha,
                        float* out, void* workspace, size_t workspace_bytes, int32_t* invalid_ids,
                        cudaStream_t stream, bool pdl, unsigned skip) {
  if (w.gate_up.slabs == nullptr || tokens < 1 || tokens > kMoeW4a8MaxTokens || top_k < 1 ||
      top_k > w.num_experts || x == nullptr || topk_ids == nullptr || topk_weights == nullptr ||
      out == nullptr || workspace == nullptr) {
    return cudaErrorInvalidValue;
  }
  const Layout l = LayoutOf(w, tokens, top_k);
  if (workspace_bytes < l.total) return cudaErrorInvalidValue;
  const int E = w.num_experts, pairs = tokens * top_k, slots = std::min(E, pairs);
  uint8_t* ws = static_cast<uint8_t*>(workspace);
  int32_t* ints = reinterpret_cast<int32_t*>(ws + l.route_ints);
  LayerArgs a{};
  a.gu = w.gate_up;
  a.dn = w.down;
  a.hidden = w.hidden;
  a.intermediate = w.intermediate;
  a.top_k = top_k;
  a.pairs = pairs;
  a.limit = limit;
  a.alpha = alpha;
  a.route.experts = E;
  a.route.count = ints;
  a.route.offset = ints + E;
  a.route.active = ints + 2 * E + 1;
  a.route.done = ints + 3 * E + 1;
  a.route.num_active = ints + 4 * E + 1;
  a.route.pair_of = ints + 4 * E + 2;
  a.route.invalid = invalid_ids;
  a.tile_done = reinterpret_cast<int32_t*>(ws + l.tile_done);
  a.xq = ws + l.xq;
  a.x_unscale = reinterpret_cast<float*>(ws + l.x_unscale);
  a.topk_weights = topk_weights;
  a.gu_part = reinterpret_cast<float*>(ws + l.gu_part);
  a.hq = ws + l.hq;
  a.h_unscale = reinterpret_cast<float*>(ws + l.h_unscale);
  a.out = out;
  a.skip = skip;
  a.gu_grid = slots * w.gate_up.row_tiles * w.gate_up.parts;
  const int dn_grid = slots * w.down.row_tiles * w.down.parts;
  // Shared memory: the larger slab, B (one 8-column group; the sums' tile
  // overlays it), the lookup.
  const int nbp = std::max(w.gate_up.blocks / w.gate_up.parts, w.down.blocks / w.down.parts);
  const size_t slab = std::max(w.gate_up.slab_bytes, w.down.slab_bytes);
  const size_t b_bytes =
      std::max<size_t>(static_cast<size_t>(nbp) * 256, kTileRows * kTileStride * sizeof(float));
  a.b_offset = slab;
  a.scale_offset = slab + b_bytes;
  a.lut_offset = a.scale_offset + static_cast<size_t>(nbp) * 8 * sizeof(float);
  const size_t smem = a.lut_offset + 16 * sizeof(uint2);

  const int tile_counters = slots * w.gate_up.row_tiles;
  const int zero_blocks = (tile_counters + kPrepThreads - 1) / kPrepThreads;
  cudaError_t err =
      LaunchPdl(PrepKernel, dim3(1 + tokens + zero_blocks), dim3(kPrepThreads), 0, stream, pdl,
                topk_ids, pairs, a.route, x, tokens, w.hidden, ws + l.xq,
                reinterpret_cast<float*>(ws + l.x_unscale), a.tile_done, tile_counters);
  if (err != cudaSuccess || (skip & kW4a8PrepOnly) != 0) return err;
  static PerDevice<size_t> allowed;
  err = AllowSharedBytes(MoeW4a8Kernel, smem, &allowed);
  if (err != cudaSuccess) return err;
  return LaunchPdl(MoeW4a8Kernel, dim3(a.gu_grid + dn_grid), dim3(kThreads), smem, stream, true, a);
}

}  // namespace

cudaError_t LaunchMoeW4a8Layer(const MoeW4a8Weights& w, const uint16_t* x, const int32_t* topk_ids,
                               const float* topk_weights, int tokens, int top_k, float limit,
                               float alpha, float* out, void* workspace, size_t workspace_bytes,
                               int32_t* invalid_ids, cudaStream_t stream, bool pdl) {
  return LaunchLayer(w, x, topk_ids, topk_weights, tokens, top_k, limit, alpha, out, workspace,
                     workspace_bytes, invalid_ids, stream, pdl, 0);
}

cudaError_t LaunchMoeW4a8LayerDiagnostic(const MoeW4a8Weights& w, const uint16_t* x,
                                         const int32_t* topk_ids, const float* topk_weights,
                                         int tokens, int top_k, float* out, void* workspace,
                                         size_t workspace_bytes, cudaStream_t stream,
                                         unsigned skip) {
  return LaunchLayer(w, x, topk_ids, topk_weights, tokens, top_k, 7.0f, 1.702f, out, workspace,
                     workspace_bytes, nullptr, stream, true, skip);
}

}  // namespace flotilla::kernels::cuda
