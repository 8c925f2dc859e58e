#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/fp4.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/moe_gemm.h"
#include "kernels/cuda/ptx.cuh"

namespace flotilla::kernels::cuda {
namespace {
using ptx::BlockExclusiveScan;
using ptx::CpAsync16;
using ptx::CpAsyncCommit;
using ptx::CpAsyncWait;
using ptx::LdMatrixX4;
using ptx::MmaF16;
using ptx::SharedAddress;

constexpr int kThreads = 256;  // 8 warps
constexpr int kBN = 128;       // output features per tile
constexpr int kBK = 64;        // reduction per stage: two MXFP4 blocks
constexpr int kARowBytes = kBK * 2;  // f16, 8 chunks of 16 bytes, XOR-swizzled by row
// 32 bytes of blocks per weight row and stage, padded to 48 so the fragment
// reads of 8 consecutive rows fall in distinct banks.
constexpr int kBRowBytes = 48;
constexpr int kMaxBlocksPerRow = 4096 / 32;

__host__ __device__ constexpr size_t AlignUp(size_t v, size_t a) { return (v + a - 1) / a * a; }

// h between the projections: gate_up writes f16(h) and, where asked
// (LaunchMoeGemm's h_low_part), the low part f16(h - f16(h)). 32-row down
// tiles (small batches, bound by the weights' decode) then multiply both,
// keeping ~22 bits of h as the decode kernels do (~5% of a batch-256 step);
// 64- and 128-row tiles (prefill, where down's doubled tensor work would
// cost 20-30%) take the high part alone, f16 (11 bits: more than the bf16
// the reference implementation keeps).
constexpr int ActivationParts(bool down, int rows) { return down && rows == 32 ? 2 : 1; }

// A stage: kActs activation tiles (down: h's high and low f16 parts) of kBM
// rows, then the weight rows.
template <int kBM, int kActs>
__host__ __device__ constexpr int StageBytes() {
  return kActs * kBM * kARowBytes + kBN * kBRowBytes;
}

template <int kBM, int kActs, int kStages>
size_t SharedBytes(int blocks_per_row) {
  return AlignUp(static_cast<size_t>(kBN) * blocks_per_row, 128) +
         static_cast<size_t>(kStages) * StageBytes<kBM, kActs>();
}

struct GemmArgs {
  const uint8_t* blocks;
  const uint8_t* scales;
  const uint16_t* bias;
  int n;  // output features of one expert
  int k;   // reduction length, a multiple of 32
  int kp;  // k rounded up to 64: the row length of the permuted activations
  MoeGemmRoute route;
  const int32_t* tile_expert;
  const int32_t* tile_row0;
  const int32_t* num_tiles;
  int top_k;
  const uint16_t* x;  // gate_up: f16 [tokens, kp], permuted
  uint16_t* h;        // gate_up writes, down reads: f16 [pairs, kp of down], routing order, permuted
  uint16_t* h_lo;     // h's low parts (h - f16(h)), same layout, for 32-row down tiles (or null)
  int h_stride;  // gate_up: the row length of h
  float limit, alpha;
  const float* topk_weights;  // down
  float* out;                 // down: f32 [tokens, n], or [pairs, n] with out_per_pair
  int out_div;                // down: the output row of pair p is p / out_div
};

// The reduction runs in a permuted order inside each group of 64 so that a
// lane's B fragments come out of two 32-bit words of MXFP4 bytes as
// DecodeWord's pairs (fp4.cuh): mma step kk, register r, half h of lane t (the logical
// position 16kk + 8r + 2t + h, which ldmatrix hands the A side) multiplies
// physical element 16t + 8(kk >> 1) + 2(kk & 1) + r + 4h. The activations are
// stored in that order (PermuteRowsKernel, and h by gate_up's epilogue).
__host__ __device__ constexpr int PhysicalOf(int logical) {
  const int h = logical & 1, t = (logical >> 1) & 3, r = (logical >> 3) & 1;
  const int kk_lo = (logical >> 4) & 1, kk_hi = (logical >> 5) & 1;
  return (t << 4) | (kk_hi << 3) | (h << 2) | (kk_lo << 1) | r;
}
__host__ __device__ constexpr int LogicalOf(int physical) {
  const int r = physical & 1, kk_lo = (physical >> 1) & 1, h = (physical >> 2) & 1;
  const int kk_hi = (physical >> 3) & 1, t = (physical >> 4) & 3;
  return (kk_hi << 5) | (kk_lo << 4) | (r << 3) | (t << 1) | h;
}
static_assert(LogicalOf(PhysicalOf(37)) == 37 && PhysicalOf(LogicalOf(21)) == 21, "bijection");

// Weights enter the tensor cores as f16: DecodeWord (fp4.cuh) gives each
// value times 2^-14, and one f16x2 multiply by 2^(s - 113 - c) makes it
// fp4 * 2^(s - 127 - c), where c is the row's shift: its largest block scale
// minus 128. Every block within 2^24 of the row's largest is then exact (an
// f16 normal or subnormal), smaller ones round at 2^-24 of it, below f32's
// own rounding of the row's sums; the epilogue multiplies the sums by 2^c.
// s = 0 (2^-127) is taken as 0, as in the decode kernels.
__device__ __forceinline__ uint32_t HalfScale(uint32_t s, int c) {
  // 2^(s - 113 - c) as an f32 (exponent field s - c + 14, at most 142; 0 for
  // multipliers below f32's normal range), rounded once to f16x2.
  const int field = max(static_cast<int>(s) - c + 14, 0);
  const float m = s == 0 ? 0.0f : __uint_as_float(static_cast<uint32_t>(field) << 23);
  const __half2 h = __float2half2_rn(m);
  return *reinterpret_cast<const uint32_t*>(&h);
}
__device__ __forceinline__ uint32_t MulHalf2(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("mul.rn.f16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
// The row shift c of a row of nb scale bytes, by the 4 lanes of a quad (each
// reads a quarter; the quad's lanes share the row).
__device__ __forceinline__ int RowShift(const uint8_t* row, int nb) {
  int m = 0;
  for (int i = threadIdx.x & 3; i < nb; i += 4) m = max(m, static_cast<int>(row[i]));
  m = max(m, __shfl_xor_sync(0xFFFFFFFFu, m, 1));
  m = max(m, __shfl_xor_sync(0xFFFFFFFFu, m, 2));
  return m - 128;
}
// v * 2^c, exactly (c in [-128, 127]).
__device__ __forceinline__ float Unshift(float v, int c) { return ldexpf(v, c); }

__device__ __forceinline__ float Bf16ToFloat(uint16_t b) {
  return __uint_as_float(static_cast<uint32_t>(b) << 16);
}

// dst[r, :] (f16, row length kp, a multiple of 64) = src[r, :] (bf16, length
// k) in the permuted order of each 64-group, zeros past k. Exact for |x| in
// f16's normal range, as in the decode kernels.
__global__ void PermuteRowsKernel(const uint16_t* src, int rows, int k, int kp, uint16_t* dst) {
  const size_t n = static_cast<size_t>(rows) * kp;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    const int r = static_cast<int>(i / kp), l = static_cast<int>(i % kp);
    const int p = (l & ~63) + PhysicalOf(l & 63);
    dst[i] = p < k ? __half_as_ushort(__float2half_rn(Bf16ToFloat(src[static_cast<size_t>(r) * k + p])))
                   : uint16_t{0};
  }
}

// Hopper warpgroup MMA with A from registers (the decoded weights: each warp
// of the warpgroup holds 16 feature rows in the mma.sync A-fragment layout)
// and B from shared memory (the activation stage: kBM token rows of 128
// bytes, 16-byte chunks XOR-swizzled by row, i.e. the 128-byte swizzle of a
// K-major operand; 8-row groups 1024 bytes apart).
__device__ __forceinline__ uint64_t SmemDescSw128(const void* p) {
  const uint64_t addr = static_cast<uint64_t>(SharedAddress(p));
  return ((addr & 0x3FFFFu) >> 4) | (uint64_t{1} << 16) | (uint64_t{1024 >> 4} << 32) |
         (uint64_t{1} << 62);
}
__device__ __forceinline__ void WgmmaFence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void WgmmaCommit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void WgmmaWaitAll() {
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
}
// wgmma reads its register operands and writes its accumulators after the
// instruction issues: these empty asm statements tell the compiler that the
// accumulators change and the A fragments are still read at the wait, so no
// read of the former moves above it and the latter's registers are not
// reused before it.
template <int kN>
__device__ __forceinline__ void FenceAccumulators(float (&d)[kN]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
template <int kSteps>
__device__ __forceinline__ void FenceFragments(uint32_t (&a)[kSteps][4]) {
#pragma unroll
  for (int i = 0; i < kSteps; ++i) {
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(a[i][j])::"memory");
  }
}
// D (64 features x 32 tokens, f32, accumulated) += A (registers) * B (desc).
__device__ __forceinline__ void WgmmaN32(float (&d)[16], const uint32_t (&a)[4], uint64_t desc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
}

// D (64 features x 64 tokens, f32, accumulated) += A (registers) * B (desc).
__device__ __forceinline__ void WgmmaN64(float (&d)[32], const uint32_t (&a)[4], uint64_t desc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
}

// D (64 features x 128 tokens, f32, accumulated) += A (registers) * B (desc).
__device__ __forceinline__ void WgmmaN128(float (&d)[64], const uint32_t (&a)[4], uint64_t desc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
}

template <int kN>
__device__ __forceinline__ void Wgmma(float (&d)[kN / 2], const uint32_t (&a)[4], uint64_t desc) {
  if constexpr (kN == 128) {
    WgmmaN128(d, a, desc);
  } else if constexpr (kN == 64) {
    WgmmaN64(d, a, desc);
  } else {
    WgmmaN32(d, a, desc);
  }
}

// The tile maps, in expert order, of an expert's rows: tiles of rows_per_tile
// rows (tile_expert / tile_row0, num_tiles), except that a last, partly filled
// tile of at most small_max rows becomes tiles of small_rows rows (small_expert
// / small_row0, num_small) when small_max > 0: such a tile decodes the same
// weights as a big one for a fraction of the tensor-core work. One block of
// 1024 threads; E <= 1024.
__global__ void __launch_bounds__(1024)
    TileMapKernel(const int32_t* count, int num_experts, int rows_per_tile, int small_max,
                  int small_rows,
                  int32_t* tile_expert, int32_t* tile_row0, int32_t* num_tiles,
                  int32_t* small_expert, int32_t* small_row0, int32_t* num_small) {
  __shared__ int32_t warp_sums[32];
  __shared__ int32_t totals[2];
  const int e = threadIdx.x;
  const int c = e < num_experts ? count[e] : 0;
  const int rest = c % rows_per_tile;
  const bool split = small_max > 0 && rest > 0 && rest <= small_max;
  const int big = c / rows_per_tile + (rest > 0 && !split ? 1 : 0);
  const int small = split ? (rest + small_rows - 1) / small_rows : 0;
  const int first = BlockExclusiveScan(big, warp_sums, &totals[0]);
  const int first_small = BlockExclusiveScan(small, warp_sums, &totals[1]);
  for (int i = 0; i < big; ++i) {
    tile_expert[first + i] = e;
    tile_row0[first + i] = i * rows_per_tile;
  }
  for (int i = 0; i < small; ++i) {
    small_expert[first_small + i] = e;
    small_row0[first_small + i] = c - rest + small_rows * i;
  }
  if (e == 0) {
    *num_tiles = totals[0];
    *num_small = totals[1];
  }
}

// Warp w of warpgroup wg in a wgmma tile decodes feature rows f0 = 64 wg +
// 16 (w % 4) + g and f0 + 8 (lane (g, t)) as the A fragments of each k16
// step; the warpgroup's accumulators hold features x tokens: d[4j + c] is
// feature f0 (+8 for c >= 2) and token row 8j + 2t + (c & 1).
__device__ __forceinline__ int WgmmaFeatureRow() {
  const int warp = threadIdx.x >> 5, g = (threadIdx.x & 31) >> 2;
  return (warp >> 2) * 64 + (warp & 3) * 16 + g;
}

// The wgmma main loop of MoeGemmKernel<..., kWgmma = true>, the first
// kStages - 1 stages already requested: d = the tile's features x rows, rows
// f0 and f0 + 8 times 2^-c0 and 2^-c1 (HalfScale).
template <int kBM, int kActs, int kStages, typename LoadStage>
__device__ __forceinline__ void WgmmaMainLoop(LoadStage& load_next, uint8_t* stages,
                                              const uint8_t* s_scales, int k_tiles, int nb, int c0,
                                              int c1, bool low, float (&d)[kBM / 2]) {
  const int t = threadIdx.x & 3;
  const int f0 = WgmmaFeatureRow();
#pragma unroll
  for (int i = 0; i < kBM / 2; ++i) d[i] = 0.f;
  for (int kt = 0; kt < k_tiles; ++kt) {
    CpAsyncWait<kStages - 2>();
    // The stage was written through the generic proxy; wgmma reads it
    // through the async proxy.
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    if (kt + kStages - 1 < k_tiles) load_next();
    CpAsyncCommit();
    const uint8_t* sa = stages + (kt % kStages) * StageBytes<kBM, kActs>();
    const uint8_t* sb = sa + kActs * kBM * kARowBytes;
    const int kb = kt * 2 + (t >> 1);
    const uint32_t sc0 = HalfScale(kb < nb ? s_scales[f0 * nb + kb] : 0u, c0);
    const uint32_t sc1 = HalfScale(kb < nb ? s_scales[(f0 + 8) * nb + kb] : 0u, c1);
    const uint2 w0 = *reinterpret_cast<const uint2*>(sb + f0 * kBRowBytes + 8 * t);
    const uint2 w1 = *reinterpret_cast<const uint2*>(sb + (f0 + 8) * kBRowBytes + 8 * t);
    const Fp4Pairs p0[2] = {DecodeWord(w0.x), DecodeWord(w0.y)};
    const Fp4Pairs p1[2] = {DecodeWord(w1.x), DecodeWord(w1.y)};
    uint32_t af[kBK / 16][4];
#pragma unroll
    for (int kk = 0; kk < kBK / 16; ++kk) {
      af[kk][0] = MulHalf2(p0[kk >> 1].p[2 * (kk & 1)], sc0);
      af[kk][1] = MulHalf2(p1[kk >> 1].p[2 * (kk & 1)], sc1);
      af[kk][2] = MulHalf2(p0[kk >> 1].p[2 * (kk & 1) + 1], sc0);
      af[kk][3] = MulHalf2(p1[kk >> 1].p[2 * (kk & 1) + 1], sc1);
    }
    FenceAccumulators(d);
    WgmmaFence();
    const uint64_t desc = SmemDescSw128(sa);
#pragma unroll
    for (int kk = 0; kk < kBK / 16; ++kk) Wgmma<kBM>(d, af[kk], desc + 2 * kk);  // +32 bytes
    if (kActs == 2 && low) {  // the low parts, against the same weights
      const uint64_t desc_lo = SmemDescSw128(sa + kBM * kARowBytes);
#pragma unroll
      for (int kk = 0; kk < kBK / 16; ++kk) Wgmma<kBM>(d, af[kk], desc_lo + 2 * kk);
    }
    WgmmaCommit();
    WgmmaWaitAll();
    FenceAccumulators(d);
    FenceFragments(af);
  }
  CpAsyncWait<0>();
}

// h[i] = f16(v) and h_lo[i] = f16(v - h[i]).
__device__ __forceinline__ void StoreHalfPair(const GemmArgs& a, size_t i, float v) {
  const __half hi = __float2half_rn(v);
  a.h[i] = __half_as_ushort(hi);
  if (a.h_lo != nullptr) a.h_lo[i] = __half_as_ushort(__float2half_rn(v - __half2float(hi)));
}

// Its epilogue: gate_up's bias and clamped SwiGLU into h, or down's bias,
// router weight and scatter-add into out.
template <bool kDown, int kBM>
__device__ __forceinline__ void WgmmaEpilogue(const GemmArgs& a, float (&d)[kBM / 2], int e,
                                              int n0, int rows, int sorted0, int c0, int c1) {
#pragma unroll
  for (int i = 0; i < kBM / 2; ++i) d[i] = Unshift(d[i], (i & 2) ? c1 : c0);
  const int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
  const int f0 = WgmmaFeatureRow();
  const uint16_t* bias = a.bias + static_cast<size_t>(e) * a.n;
#pragma unroll
  for (int j = 0; j < kBM / 8; ++j) {
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int col = n0 + f0 + (c >= 2 ? 8 : 0);
      const int r = 8 * j + 2 * t + (c & 1);
      if constexpr (!kDown) {
        // Interleaved features: gate 2m (even g) and up 2m + 1 (lane ^ 4).
        const float up_raw = __shfl_xor_sync(0xFFFFFFFFu, d[4 * j + c], 4);
        if ((g & 1) != 0 || col >= a.n || r >= rows) continue;
        const float gate = fminf(d[4 * j + c] + Bf16ToFloat(bias[col]), a.limit);
        const float up =
            fminf(fmaxf(up_raw + Bf16ToFloat(bias[col + 1]), -a.limit), a.limit);
        const float glu = gate * (1.0f / (1.0f + expf(-(gate * a.alpha))));
        const int m = col / 2;  // down's reduction index, stored permuted
        StoreHalfPair(a,
                      static_cast<size_t>(sorted0 + r) * a.h_stride + (m & ~63) + LogicalOf(m & 63),
                      (up + 1.0f) * glu);
      } else {
        if (col >= a.n || r >= rows) continue;
        const int pair = a.route.pair_of[sorted0 + r];
        atomicAdd(a.out + static_cast<size_t>(pair / a.out_div) * a.n + col,
                  a.topk_weights[pair] * (d[4 * j + c] + Bf16ToFloat(bias[col])));
      }
    }
  }
}

// One (row tile, 128 features) tile of one projection; see moe_gemm.h.
// kWarpsM warps split the rows, the other 8 / kWarpsM split the features;
// kStages stages of the reduction are in flight.
// kWgmma: the two warpgroups each own 64 of the 128 features and multiply
// them against all kBM rows with wgmma (A: the decoded weights in registers;
// B: the activation stage in shared memory), instead of mma.sync warp tiles.
template <bool kDown, int kBM, int kWarpsM, int kStages, bool kWgmma = false>
__global__ void __launch_bounds__(kThreads, kWgmma ? 1 : 2) MoeGemmKernel(GemmArgs a) {
  constexpr int kActs = ActivationParts(kDown, kBM);
  constexpr int kWarpsN = 8 / kWarpsM;
  constexpr int kWarpRows = kBM / kWarpsM, kWarpCols = kBN / kWarpsN;
  constexpr int kMi = kWarpRows / 16, kNj = kWarpCols / 8;
  constexpr int kARowsPerThread = kBM * 8 / kThreads;
  static_assert(kMi >= 1 && kNj >= 1 && kARowsPerThread >= 1, "tile shape");

  const int tile = blockIdx.y;
  if (tile >= *a.num_tiles) return;
  extern __shared__ __align__(16) uint8_t smem[];
  const int e = a.tile_expert[tile];
  const int row0 = a.tile_row0[tile];
  const int rows = min(kBM, a.route.count[e] - row0);
  const int sorted0 = a.route.offset[e] + row0;
  const int n0 = blockIdx.x * kBN;
  const int valid_n = min(kBN, a.n - n0);
  const int nb = a.k / 32;
  const int k_tiles = (a.k + kBK - 1) / kBK;
  const int tid = threadIdx.x;

  uint8_t* s_scales = smem;
  uint8_t* stages = s_scales + AlignUp(static_cast<size_t>(kBN) * nb, 128);
  if constexpr (kWgmma) {
    // The 128-byte swizzle is taken from address bits: stages start on 1024.
    const uint32_t off = SharedAddress(stages) & 1023u;
    if (off != 0) stages += 1024 - off;
  }

  // The tile's scales, once: [kBN rows][nb]; rows past the end read 0 (their
  // weights are zero-filled too).
  const uint8_t* scale_src = a.scales + (static_cast<size_t>(e) * a.n + n0) * nb;
  const int scale_bytes = valid_n * nb;
  if (((reinterpret_cast<uintptr_t>(scale_src) | static_cast<uintptr_t>(scale_bytes)) & 15) == 0) {
    for (int i = tid * 16; i < scale_bytes; i += kThreads * 16) CpAsync16(s_scales + i, scale_src + i, 16);
  } else {
    for (int i = tid; i < scale_bytes; i += kThreads) s_scales[i] = scale_src[i];
  }
  for (int i = scale_bytes + tid; i < kBN * nb; i += kThreads) s_scales[i] = 0;

  // This thread's share of every stage: chunk a_chunk of kARowsPerThread
  // activation rows and one 16-byte half of a weight row's two blocks. The
  // destinations within a stage and the sources are set up once; each
  // load_next() copies the next stage and steps the sources by one stage, so
  // the loop spends no instructions on addresses.
  const int a_chunk = tid & 7;
  const uint16_t* a_next[kARowsPerThread];
  uint32_t a_dst[kARowsPerThread];
  int a_bytes[kARowsPerThread];
#pragma unroll
  for (int j = 0; j < kARowsPerThread; ++j) {
    const int r = (tid >> 3) + 32 * j;
    const bool ok = r < rows;
    const int s = sorted0 + (ok ? r : 0);
    a_next[j] = (kDown ? a.h + static_cast<size_t>(s) * a.kp
                       : a.x + static_cast<size_t>(a.route.pair_of[s] / a.top_k) * a.kp) +
                a_chunk * 8;  // rows are padded to whole stages
    a_dst[j] = r * kARowBytes + ((a_chunk ^ (r & 7)) << 4);
    a_bytes[j] = ok ? 16 : 0;
  }
  const int b_row = tid >> 1, b_half = tid & 1;
  const bool b_row_ok = b_row < valid_n;
  const uint8_t* b_next =
      a.blocks + ((static_cast<size_t>(e) * a.n + n0 + (b_row_ok ? b_row : 0)) * nb + b_half) * 16;
  const uint32_t b_dst = kActs * kBM * kARowBytes + b_row * kBRowBytes + b_half * 16;
  // down: the low parts' rows sit at a fixed distance from the high parts'.
  const bool low = kActs == 2 && a.h_lo != nullptr;
  const ptrdiff_t lo_delta = low ? a.h_lo - a.h : 0;
  int b_block = b_half;  // the block this thread copies next
  // The next stage's shared address, stepping through the ring.
  const uint32_t first_stage = SharedAddress(stages);
  const uint32_t last_stage = first_stage + (kStages - 1) * StageBytes<kBM, kActs>();
  uint32_t next_stage = first_stage;
  auto load_next = [&]() {
#pragma unroll
    for (int j = 0; j < kARowsPerThread; ++j) {
      CpAsync16(next_stage + a_dst[j], a_next[j], a_bytes[j]);
      if (low) {
        CpAsync16(next_stage + kBM * kARowBytes + a_dst[j], a_next[j] + lo_delta, a_bytes[j]);
      }
      a_next[j] += kBK;
    }
    const bool b_ok = b_row_ok && b_block < nb;
    CpAsync16(next_stage + b_dst, b_next, b_ok ? 16 : 0);  // 0 bytes: nothing is read
    b_next += 32;
    b_block += 2;
    next_stage = next_stage == last_stage ? first_stage : next_stage + StageBytes<kBM, kActs>();
  };

  // The first kStages - 1 stages in flight (both paths consume them in order).
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < k_tiles) load_next();
    CpAsyncCommit();
  }
  if constexpr (kWgmma) {
    CpAsyncWait<kStages - 2>();  // the scales have landed (with the first stage)
    __syncthreads();
    const int f0 = WgmmaFeatureRow();
    const int c0 = RowShift(s_scales + f0 * nb, nb), c1 = RowShift(s_scales + (f0 + 8) * nb, nb);
    float d[kBM / 2];
    WgmmaMainLoop<kBM, kActs, kStages>(load_next, stages, s_scales, k_tiles, nb, c0, c1, low, d);
    WgmmaEpilogue<kDown, kBM>(a, d, e, n0, rows, sorted0, c0, c1);
    return;
  }
  const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int wm = (warp % kWarpsM) * kWarpRows, wn = (warp / kWarpsM) * kWarpCols;
  CpAsyncWait<kStages - 2>();  // the scales have landed (with the first stage)
  __syncthreads();
  int shift[kNj];  // the row shift of feature row wn + 8j + g
#pragma unroll
  for (int j = 0; j < kNj; ++j) shift[j] = RowShift(s_scales + (wn + 8 * j + g) * nb, nb);
  float acc[kMi][kNj][4];
#pragma unroll
  for (int i = 0; i < kMi; ++i)
#pragma unroll
    for (int j = 0; j < kNj; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[i][j][c] = 0.f;

  for (int kt = 0; kt < k_tiles; ++kt) {
    CpAsyncWait<kStages - 2>();
    __syncthreads();
    if (kt + kStages - 1 < k_tiles) load_next();
    CpAsyncCommit();
    const uint8_t* sa = stages + (kt % kStages) * StageBytes<kBM, kActs>();
    const uint8_t* sb = sa + kActs * kBM * kARowBytes;
    // Lane t's words 2t and 2t + 1 of each row hold block 2kt + t / 2.
    uint32_t scale[kNj];
    Fp4Pairs pairs[kNj][2];
#pragma unroll
    for (int j = 0; j < kNj; ++j) {
      const int r = wn + 8 * j + g;
      const int kb = kt * 2 + (t >> 1);
      scale[j] = HalfScale(kb < nb ? s_scales[r * nb + kb] : 0u, shift[j]);
      const uint2 w = *reinterpret_cast<const uint2*>(sb + r * kBRowBytes + 8 * t);
      pairs[j][0] = DecodeWord(w.x);
      pairs[j][1] = DecodeWord(w.y);
    }
#pragma unroll
    for (int kk = 0; kk < kBK / 16; ++kk) {
      uint32_t af[kMi][4], af_lo[kActs == 2 ? kMi : 1][4];
#pragma unroll
      for (int i = 0; i < kMi; ++i) {
        const int r = wm + 16 * i + (lane & 15);
        const int chunk = 2 * kk + (lane >> 4);
        LdMatrixX4(af[i], sa + r * kARowBytes + ((chunk ^ (r & 7)) << 4));
        if (low) {
          LdMatrixX4(af_lo[i], sa + (kBM + r) * kARowBytes + ((chunk ^ (r & 7)) << 4));
        }
      }
#pragma unroll
      for (int j = 0; j < kNj; ++j) {
        const Fp4Pairs& pw = pairs[j][kk >> 1];
        const uint32_t b0 = MulHalf2(pw.p[2 * (kk & 1)], scale[j]);
        const uint32_t b1 = MulHalf2(pw.p[2 * (kk & 1) + 1], scale[j]);
#pragma unroll
        for (int i = 0; i < kMi; ++i) MmaF16(acc[i][j], af[i], b0, b1);
        if (low) {  // the low parts, against the same weights
#pragma unroll
          for (int i = 0; i < kMi; ++i) MmaF16(acc[i][j], af_lo[i], b0, b1);
        }
      }
    }
  }
  CpAsyncWait<0>();

  // Epilogue: thread holds rows wm + 16i + g (+8) and features wn + 8j + 2t, +1.
  const uint16_t* bias = a.bias + static_cast<size_t>(e) * a.n;
#pragma unroll
  for (int j = 0; j < kNj; ++j) {
    const int col = n0 + wn + 8 * j + 2 * t;
    // acc[i][j] holds features col, col + 1 of lanes g = 2t, 2t + 1: their shifts.
    const int sh0 = __shfl_sync(0xFFFFFFFFu, shift[j], (2 * t) * 4);
    const int sh1 = __shfl_sync(0xFFFFFFFFu, shift[j], (2 * t + 1) * 4);
    if (col >= a.n) continue;
    const float b0 = Bf16ToFloat(bias[col]), b1 = Bf16ToFloat(bias[col + 1]);
#pragma unroll
    for (int i = 0; i < kMi; ++i) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = wm + 16 * i + g + 8 * half;
        if (r >= rows) continue;
        const float v0 = Unshift(acc[i][j][2 * half], sh0) + b0;
        const float v1 = Unshift(acc[i][j][2 * half + 1], sh1) + b1;
        if constexpr (!kDown) {
          // Interleaved rows: feature 2m is gate m, 2m + 1 is up m.
          const float gate = fminf(v0, a.limit);
          const float up = fminf(fmaxf(v1, -a.limit), a.limit);
          const float glu = gate * (1.0f / (1.0f + expf(-(gate * a.alpha))));
          const int m = col / 2;  // down's reduction index, stored permuted
          StoreHalfPair(
              a, static_cast<size_t>(sorted0 + r) * a.h_stride + (m & ~63) + LogicalOf(m & 63),
              (up + 1.0f) * glu);
        } else {
          const int pair = a.route.pair_of[sorted0 + r];
          const float wgt = a.topk_weights[pair];
          float* dst = a.out + static_cast<size_t>(pair / a.out_div) * a.n + col;
          atomicAdd(dst, wgt * v0);
          atomicAdd(dst + 1, wgt * v1);
        }
      }
    }
  }
}

template <bool kDown, int kBM, int kWarpsM, int kStages, bool kWgmma = false>
cudaError_t LaunchProjection(const GemmArgs& args, int max_tiles, cudaStream_t stream) {
  auto kernel = MoeGemmKernel<kDown, kBM, kWarpsM, kStages, kWgmma>;
  constexpr size_t kAlignSlack = kWgmma ? 1024 : 0;  // stages aligned to 1024 bytes
  constexpr int kActs = ActivationParts(kDown, kBM);
  const size_t smem = SharedBytes<kBM, kActs, kStages>(kMaxBlocksPerRow) + kAlignSlack;
  // Set once per device, so later calls may sit in a graph capture.
  static PerDevice<size_t> allowed;
  const cudaError_t err = AllowSharedBytes(kernel, smem, &allowed);
  if (err != cudaSuccess) return err;
  const dim3 grid((args.n + kBN - 1) / kBN, static_cast<unsigned>(max_tiles));
  kernel<<<grid, kThreads, SharedBytes<kBM, kActs, kStages>(args.k / 32) + kAlignSlack, stream>>>(
      args);
  return cudaGetLastError();
}

template <int kBM, int kWarpsM, int kStages, bool kWgmma = false>
cudaError_t LaunchProjection(bool down, const GemmArgs& args, int max_tiles, cudaStream_t stream) {
  return down ? LaunchProjection<true, kBM, kWarpsM, kStages, kWgmma>(args, max_tiles, stream)
              : LaunchProjection<false, kBM, kWarpsM, kStages, kWgmma>(args, max_tiles, stream);
}

int MaxTiles(int pairs, int num_experts, int rows_per_tile) {
  return pairs / rows_per_tile + std::min(num_experts, pairs) + 1;
}
// 32-row remainder tiles: at most two per touched expert (remainders <= 64).
int MaxSmallTiles(int pairs, int num_experts) { return 2 * std::min(num_experts, pairs) + 1; }

}  // namespace

int Padded64(int v) { return (v + 63) / 64 * 64; }

size_t MoeGemmWorkspaceBytes(const MoeDeviceWeights& w, int tokens, int top_k) {
  const int pairs = tokens * top_k;
  if (pairs <= 0) return 0;
  const size_t tiles = static_cast<size_t>(MaxTiles(pairs, w.num_experts, 32)) +
                       static_cast<size_t>(MaxSmallTiles(pairs, w.num_experts));
  return 2 * AlignUp(static_cast<size_t>(pairs) * Padded64(w.intermediate) * sizeof(uint16_t),
                     256) +
         AlignUp(static_cast<size_t>(tokens) * Padded64(w.hidden) * sizeof(uint16_t), 256) +
         AlignUp((2 * tiles + 2) * sizeof(int32_t), 256);
}

cudaError_t LaunchMoeGemm(const MoeDeviceWeights& w, const uint16_t* x, const float* topk_weights,
                          int tokens, int top_k, float limit, float alpha, MoeGemmRoute route,
                          float* out, void* workspace, int rows_per_tile, bool remainder_tiles,
                          bool wgmma, cudaStream_t stream, bool out_per_pair, bool h_low_part) {
  if ((rows_per_tile != 32 && rows_per_tile != 64 && rows_per_tile != 128) ||
      w.num_experts > 1024 || w.hidden % 32 != 0 || w.intermediate % 32 != 0 ||
      w.hidden > 4096 || w.intermediate > 4096) {
    return cudaErrorInvalidValue;
  }
  const int pairs = tokens * top_k;
  if (pairs <= 0) return cudaSuccess;
  const int hp = Padded64(w.hidden), ip = Padded64(w.intermediate);
  auto* base = static_cast<uint8_t*>(workspace);
  const size_t h_bytes = AlignUp(static_cast<size_t>(pairs) * ip * sizeof(uint16_t), 256);
  auto* h = reinterpret_cast<uint16_t*>(base);
  auto* h_lo = reinterpret_cast<uint16_t*>(base + h_bytes);
  base += 2 * h_bytes;
  auto* xp = reinterpret_cast<uint16_t*>(base);
  base += AlignUp(static_cast<size_t>(tokens) * hp * sizeof(uint16_t), 256);
  const int max_tiles = MaxTiles(pairs, w.num_experts, rows_per_tile);
  const int max_small = MaxSmallTiles(pairs, w.num_experts);
  auto* tile_expert = reinterpret_cast<int32_t*>(base);
  int32_t* tile_row0 = tile_expert + max_tiles;
  int32_t* num_tiles = tile_row0 + max_tiles;
  int32_t* small_expert = num_tiles + 1;
  int32_t* small_row0 = small_expert + max_small;
  int32_t* num_small = small_row0 + max_small;
  // Remainders of up to half a big tile go to half-height tiles (32 rows
  // without wgmma), which decode the same weights for less tensor-core work.
  // H200, 120b layer, with -> without: 1024 tokens 1066 -> 1197 us, 2048
  // tokens 1813 -> 1795, 4096 tokens 2746 -> 2789.
  const int small_rows = wgmma ? rows_per_tile / 2 : 32;
  const int small_max =
      remainder_tiles && rows_per_tile > small_rows ? rows_per_tile / 2 : 0;

  const size_t x_elems = static_cast<size_t>(tokens) * hp;
  PermuteRowsKernel<<<static_cast<unsigned>(std::min<size_t>((x_elems + 255) / 256, 4096)), 256,
                      0, stream>>>(x, tokens, w.hidden, hp, xp);
  TileMapKernel<<<1, 1024, 0, stream>>>(route.count, w.num_experts, rows_per_tile, small_max,
                                        small_rows, tile_expert, tile_row0, num_tiles,
                                        small_expert, small_row0, num_small);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  if (ip != w.intermediate) {
    // The padding of h's rows is never written by gate_up: it must read 0.
    err = cudaMemsetAsync(h, 0, 2 * h_bytes, stream);  // and h_lo
    if (err != cudaSuccess) return err;
  }

  GemmArgs gu{};
  gu.blocks = w.gate_up_blocks, gu.scales = w.gate_up_scales, gu.bias = w.gate_up_bias;
  gu.n = 2 * w.intermediate, gu.k = w.hidden, gu.kp = hp;
  gu.route = route, gu.tile_expert = tile_expert, gu.tile_row0 = tile_row0;
  gu.num_tiles = num_tiles, gu.top_k = top_k;
  gu.x = xp, gu.h = h, gu.h_lo = h_lo, gu.h_stride = ip, gu.limit = limit, gu.alpha = alpha;
  GemmArgs dn = gu;
  dn.blocks = w.down_blocks, dn.scales = w.down_scales, dn.bias = w.down_bias;
  dn.n = w.hidden, dn.k = w.intermediate, dn.kp = ip;
  dn.topk_weights = topk_weights, dn.out = out, dn.out_div = out_per_pair ? 1 : top_k;
  GemmArgs gu_small = gu, dn_small = dn;
  // Only 32-row down kernels read h's low parts: gate_up writes them for the
  // rows those kernels will take (all of them, or the remainders, which run
  // as 64-row kernels when small_rows is 64, else as 32-row ones).
  if (!h_low_part) gu.h_lo = gu_small.h_lo = dn.h_lo = dn_small.h_lo = nullptr;
  if (rows_per_tile != 32) gu.h_lo = nullptr;
  if (small_rows == 64) gu_small.h_lo = nullptr;
  gu_small.tile_expert = dn_small.tile_expert = small_expert;
  gu_small.tile_row0 = dn_small.tile_row0 = small_row0;
  gu_small.num_tiles = dn_small.num_tiles = num_small;
  // gate_up (big tiles, then the 32-row remainders) before down reads h.
  // Stages: 8 for 32-row tiles and 6 for 64 (2 CTAs per SM) measured no
  // better than 4 (3 CTAs per SM), nor did L2::256B prefetch hints on the
  // copies: small tiles are bound by the decode's instructions, not by the
  // bytes in flight.
  for (const bool down : {false, true}) {
    const GemmArgs& big = down ? dn : gu;
    switch (rows_per_tile) {
      case 128:
        err = wgmma ? LaunchProjection<128, 2, 4, true>(down, big, max_tiles, stream)
                    : LaunchProjection<128, 2, 4>(down, big, max_tiles, stream);
        break;
      case 64:
        err = wgmma ? LaunchProjection<64, 1, 4, true>(down, big, max_tiles, stream)
                    : LaunchProjection<64, 1, 4>(down, big, max_tiles, stream);
        break;
      default:
        err = wgmma ? LaunchProjection<32, 1, 4, true>(down, big, max_tiles, stream)
                    : LaunchProjection<32, 1, 4>(down, big, max_tiles, stream);
        break;
    }
    if (err == cudaSuccess && small_max > 0) {
      const GemmArgs& small = down ? dn_small : gu_small;
      err = small_rows == 64 ? LaunchProjection<64, 1, 4, true>(down, small, max_small, stream)
            : wgmma          ? LaunchProjection<32, 1, 4, true>(down, small, max_small, stream)
                             : LaunchProjection<32, 1, 4>(down, small, max_small, stream);
    }
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

}  // namespace flotilla::kernels::cuda
