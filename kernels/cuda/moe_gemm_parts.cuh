// Pieces of the MXFP4 grouped GEMMs shared by the CTA-per-tile kernels
// (moe_gemm.cu) and the warp-specialized persistent ones (moe_gemm_ws.cu):
// the kernels' arguments, the permuted reduction order, the weights' f16
// scaling, warpgroup MMA (wgmma) wrappers and the wgmma tiles' epilogue.
// Included by .cu files only.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/fp4.cuh"
#include "kernels/cuda/moe_gemm.h"
#include "kernels/cuda/ptx.cuh"

namespace flotilla::kernels::cuda::moe_gemm {

using ptx::SharedAddress;

__host__ __device__ constexpr size_t AlignUp(size_t v, size_t a) { return (v + a - 1) / a * a; }
// Rows of activations and h are padded to whole 64-value groups.
__host__ __device__ constexpr int Padded64(int v) { return (v + 63) / 64 * 64; }

// The height of an expert's big tiles at a tiling of `rows_per_tile` rows,
// for an expert of `count` rows: at 160, 160 where such tiles cover the
// expert in fewer passes over its weights than 128-row ones (129-160 rows:
// one tile, not a 128-row one and a remainder that decodes the same weights
// again), else 128.
__host__ __device__ constexpr int ExpertTileRows(int count, int rows_per_tile) {
  if (rows_per_tile != 160) return rows_per_tile;
  return (count + 159) / 160 < (count + 127) / 128 ? 160 : 128;
}

struct GemmArgs {
  const uint8_t* blocks;
  const uint8_t* scales;
  const uint16_t* bias;
  int n;   // output features of one expert
  int k;   // reduction length, a multiple of 32
  int kp;  // k rounded up to 64: the row length of the permuted activations
  MoeGemmRoute route;
  const int32_t* tile_expert;
  const int32_t* tile_row0;
  const int32_t* num_tiles;
  int top_k;
  const uint16_t* x;  // gate_up: f16 [tokens, kp], permuted
  uint16_t* h;     // gate_up writes, down reads: f16 [pairs, kp of down], routing order, permuted
  uint16_t* h_lo;  // h's low parts (h - f16(h)), same layout, for 32-row down tiles (or null)
  int h_stride;    // gate_up: the row length of h
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

// Hopper warpgroup MMA (wgmma, ptx.cuh) with A from registers (the decoded
// weights: each warp of the warpgroup holds 16 feature rows in the mma.sync
// A-fragment layout) and B from shared memory (the activation stage: kBM token
// rows of 128 bytes in the 128-byte swizzle, SmemDescSw128).
using ptx::SmemDescSw128;
using ptx::WgmmaCommit;
using ptx::WgmmaFence;
using ptx::WgmmaWaitAll;
// wgmma reads its register operands and writes its accumulators after the
// instruction issues: these empty asm statements tell the compiler that the
// accumulators change and the A fragments are still read at the wait, so no
// read of the former moves above it and the latter's registers are not
// reused before it.
// kCount: the accumulators the wgmmas write (a narrower wgmma than the tile
// leaves the rest zero, which the compiler then need not hold in registers).
template <int kCount, int kD>
__device__ __forceinline__ void FenceAccumulators(float (&d)[kD]) {
  static_assert(kCount <= kD, "accumulators");
#pragma unroll
  for (int i = 0; i < kCount; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
template <int kSteps>
__device__ __forceinline__ void FenceFragments(uint32_t (&a)[kSteps][4]) {
#pragma unroll
  for (int i = 0; i < kSteps; ++i) {
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(a[i][j])::"memory");
  }
}
// The wrappers below take a tile's accumulators (kD of them: kBM / 2 for a
// tile of kBM token rows) and multiply into the first N / 2, the tile's
// first N rows.
// D (64 features x 32 tokens, f32, accumulated) += A (registers) * B (desc).
template <int kD>
__device__ __forceinline__ void WgmmaN32(float (&d)[kD], const uint32_t (&a)[4], uint64_t desc) {
  static_assert(kD >= 16, "accumulators");
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, "
      "%10, %11, %12, %13, %14, %15}, {%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
}

// D (64 features x 64 tokens, f32, accumulated) += A (registers) * B (desc).
template <int kD>
__device__ __forceinline__ void WgmmaN64(float (&d)[kD], const uint32_t (&a)[4], uint64_t desc) {
  static_assert(kD >= 32, "accumulators");
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, "
      "%10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, "
      "%28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
}

// D (64 features x 80 tokens, f32, accumulated) += A (registers) * B (desc).
template <int kD>
__device__ __forceinline__ void WgmmaN80(float (&d)[kD], const uint32_t (&a)[4], uint64_t desc) {
  static_assert(kD >= 40, "accumulators");
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %45, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n80k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, "
      "%10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, "
      "%28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39}, {%40, %41, %42, %43}, "
      "%44, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
        "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
}

// D (64 features x 96 tokens, f32, accumulated) += A (registers) * B (desc).
template <int kD>
__device__ __forceinline__ void WgmmaN96(float (&d)[kD], const uint32_t (&a)[4], uint64_t desc) {
  static_assert(kD >= 48, "accumulators");
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %53, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n96k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, "
      "%9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, "
      "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, "
      "%35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47}, {%48, %49, %50, %51}, "
      "%52, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
        "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
}

// D (64 features x 128 tokens, f32, accumulated) += A (registers) * B (desc).
template <int kD>
__device__ __forceinline__ void WgmmaN128(float (&d)[kD], const uint32_t (&a)[4], uint64_t desc) {
  static_assert(kD >= 64, "accumulators");
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, "
      "%9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, "
      "%27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, "
      "%45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, "
      "%63}, {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
        "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),
        "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
}

// D (64 features x 160 tokens, f32, accumulated) += A (registers) * B (desc).
template <int kD>
__device__ __forceinline__ void WgmmaN160(float (&d)[kD], const uint32_t (&a)[4], uint64_t desc) {
  static_assert(kD >= 80, "accumulators");
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %85, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n160k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, "
      "%9, "
      "%10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, "
      "%27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, "
      "%44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, "
      "%61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, "
      "%78, %79}, {%80, %81, %82, %83}, "
      "%84, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
        "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),
        "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]),
        "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]),
        "+f"(d[77]), "+f"(d[78]), "+f"(d[79])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
}

// The first kN rows of a tile's accumulators d (kBM / 2 of them, kN <= kBM)
// += A * B: a tile whose rows from kN on are empty leaves them out of the
// tensor cores' work.
template <int kN, int kD>
__device__ __forceinline__ void WgmmaFirst(float (&d)[kD], const uint32_t (&a)[4], uint64_t desc) {
  if constexpr (kN == 160) {
    WgmmaN160(d, a, desc);
  } else if constexpr (kN == 128) {
    WgmmaN128(d, a, desc);
  } else if constexpr (kN == 96) {
    WgmmaN96(d, a, desc);
  } else if constexpr (kN == 80) {
    WgmmaN80(d, a, desc);
  } else if constexpr (kN == 64) {
    WgmmaN64(d, a, desc);
  } else {
    static_assert(kN == 32, "wgmma width");
    WgmmaN32(d, a, desc);
  }
}

// The wgmma width for a tile of kBM rows holding `rows` of them.
template <int kBM>
__device__ __forceinline__ int WgmmaWidth(int rows) {
  return min(kBM, (rows + 31) / 32 * 32);
}

// Warp w of warpgroup wg in a wgmma tile decodes feature rows f0 = 64 wg +
// 16 (w % 4) + g and f0 + 8 (lane (g, t)) as the A fragments of each k16
// step; the warpgroup's accumulators hold features x tokens: d[4j + c] is
// feature f0 (+8 for c >= 2) and token row 8j + 2t + (c & 1).
__device__ __forceinline__ int WgmmaFeatureRow() {
  const int warp = threadIdx.x >> 5, g = (threadIdx.x & 31) >> 2;
  return (warp >> 2) * 64 + (warp & 3) * 16 + g;
}

// One 64-deep stage of a wgmma tile, waited for: the thread's feature rows
// f0 and f0 + 8 (WgmmaFeatureRow) of the weight stage `sb` (rows of
// kRowBytes, two MXFP4 blocks each) decoded into A fragments, scaled by
// their blocks' HalfScale of the tile's scale rows (`s_scales`, nb per row),
// and multiplied into d against the activation stage `sa` (and, where
// `sa_low` is set, against h's low parts there too). Word x of each row
// holds k steps 0 and 1, word y steps 2 and 3: each half's wgmmas issue as
// soon as its fragments are decoded, so the tensor cores start while the
// second half decodes.
// kN: the rows multiplied (WgmmaWidth of the tile's rows; kBM covers them
// all). A width chosen per tile picks its own instantiation of the whole
// loop: a choice between wgmmas inside the loop made the compiler fence
// every one of them.
// WgmmaStageDesc takes the activation stage as its wgmma descriptor `desc`
// (SmemDescSw128 of it), so that a loop with the stage's slot known at
// compile time forms the descriptor once.
template <int kBM, int kRowBytes, int kN = kBM>
__device__ __forceinline__ void WgmmaStageDesc(uint64_t desc, const uint8_t* sb,
                                               const uint8_t* s_scales, int nb, int kt, int c0,
                                               int c1, const uint8_t* sa_low, float (&d)[kBM / 2]) {
  constexpr int kSteps = 4;  // k16 steps per stage
  const int t = threadIdx.x & 3;
  const int f0 = WgmmaFeatureRow();
  const int kb = kt * 2 + (t >> 1);
  const uint32_t sc0 = HalfScale(kb < nb ? s_scales[f0 * nb + kb] : 0u, c0);
  const uint32_t sc1 = HalfScale(kb < nb ? s_scales[(f0 + 8) * nb + kb] : 0u, c1);
  const uint2 w0 = *reinterpret_cast<const uint2*>(sb + f0 * kRowBytes + 8 * t);
  const uint2 w1 = *reinterpret_cast<const uint2*>(sb + (f0 + 8) * kRowBytes + 8 * t);
  uint32_t af[kSteps][4];
  FenceAccumulators<kN / 2>(d);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const Fp4Pairs p0 = DecodeWord(half == 0 ? w0.x : w0.y);
    const Fp4Pairs p1 = DecodeWord(half == 0 ? w1.x : w1.y);
#pragma unroll
    for (int k2 = 0; k2 < 2; ++k2) {
      const int kk = 2 * half + k2;
      af[kk][0] = MulHalf2(p0.p[2 * k2], sc0);
      af[kk][1] = MulHalf2(p1.p[2 * k2], sc1);
      af[kk][2] = MulHalf2(p0.p[2 * k2 + 1], sc0);
      af[kk][3] = MulHalf2(p1.p[2 * k2 + 1], sc1);
    }
    WgmmaFence();
#pragma unroll
    for (int k2 = 0; k2 < 2; ++k2) {
      const int kk = 2 * half + k2;
      WgmmaFirst<kN>(d, af[kk], desc + 2 * kk);  // +32 bytes per k step
    }
  }
  if (sa_low != nullptr) {  // the low parts, against the same weights
    const uint64_t desc_lo = SmemDescSw128(sa_low);
#pragma unroll
    for (int kk = 0; kk < kSteps; ++kk) WgmmaFirst<kN>(d, af[kk], desc_lo + 2 * kk);
  }
  WgmmaCommit();
  WgmmaWaitAll();
  FenceAccumulators<kN / 2>(d);
  FenceFragments(af);
}

template <int kBM, int kRowBytes, int kN = kBM>
__device__ __forceinline__ void WgmmaStage(const uint8_t* sa, const uint8_t* sb,
                                           const uint8_t* s_scales, int nb, int kt, int c0, int c1,
                                           const uint8_t* sa_low, float (&d)[kBM / 2]) {
  WgmmaStageDesc<kBM, kRowBytes, kN>(SmemDescSw128(sa), sb, s_scales, nb, kt, c0, c1, sa_low, d);
}

// h[i] = f16(v) and h_lo[i] = f16(v - h[i]).
__device__ __forceinline__ void StoreHalfPair(const GemmArgs& a, size_t i, float v) {
  const __half hi = __float2half_rn(v);
  a.h[i] = __half_as_ushort(hi);
  if (a.h_lo != nullptr) a.h_lo[i] = __half_as_ushort(__float2half_rn(v - __half2float(hi)));
}

// 2^c as an f32, exactly, for c in [-149, 127] (subnormal below -126).
__device__ __forceinline__ float Pow2(int c) {
  return __uint_as_float(c >= -126 ? static_cast<uint32_t>(c + 127) << 23
                                   : 0x00800000u >> (-126 - c));
}

// Its epilogue: gate_up's bias and clamped SwiGLU into h, or down's bias,
// router weight and scatter-add into out. A thread's accumulators hold two
// features (f0 and f0 + 8: d[4j + c], c >= 2 the second) of rows 8j + 2t +
// (c & 1), so everything that depends on the feature alone (the unshift,
// the bias, h's permuted column) is formed once, and the row's pair and
// router weight once per row.
template <bool kDown, int kBM>
__device__ __forceinline__ void WgmmaEpilogue(const GemmArgs& a, float (&d)[kBM / 2], int e, int n0,
                                              int rows, int sorted0, int c0, int c1) {
  const int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
  const int col[2] = {n0 + WgmmaFeatureRow(), n0 + WgmmaFeatureRow() + 8};
  const float unshift[2] = {Pow2(c0), Pow2(c1)};
  const uint16_t* bias = a.bias + static_cast<size_t>(e) * a.n;
  if constexpr (!kDown) {
    // Interleaved features: gate 2m (even g) and up 2m + 1 (lane ^ 4, whose
    // shift it also takes).
    float up_unshift[2], gate_bias[2], up_bias[2];
    int h_col[2];
#pragma unroll
    for (int f = 0; f < 2; ++f) {
      up_unshift[f] = __shfl_xor_sync(0xFFFFFFFFu, unshift[f], 4);
      const bool ok = (g & 1) == 0 && col[f] < a.n;
      gate_bias[f] = ok ? Bf16ToFloat(bias[col[f]]) : 0.0f;
      up_bias[f] = ok ? Bf16ToFloat(bias[col[f] + 1]) : 0.0f;
      const int m = col[f] / 2;  // down's reduction index, stored permuted
      h_col[f] = (m & ~63) + LogicalOf(m & 63);
    }
#pragma unroll
    for (int j = 0; j < kBM / 8; ++j) {
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int f = c >> 1, r = 8 * j + 2 * t + (c & 1);
        const float up_raw = __shfl_xor_sync(0xFFFFFFFFu, d[4 * j + c], 4);
        if ((g & 1) != 0 || col[f] >= a.n || r >= rows) continue;
        const float gate = fminf(fmaf(d[4 * j + c], unshift[f], gate_bias[f]), a.limit);
        const float up = fminf(fmaxf(fmaf(up_raw, up_unshift[f], up_bias[f]), -a.limit), a.limit);
        const float glu = gate * (1.0f / (1.0f + expf(-(gate * a.alpha))));
        StoreHalfPair(a, static_cast<size_t>(sorted0 + r) * a.h_stride + h_col[f],
                      (up + 1.0f) * glu);
      }
    }
  } else {
    float feature_bias[2];
#pragma unroll
    for (int f = 0; f < 2; ++f) feature_bias[f] = col[f] < a.n ? Bf16ToFloat(bias[col[f]]) : 0.0f;
#pragma unroll
    for (int j = 0; j < kBM / 8; ++j) {
#pragma unroll
      for (int odd = 0; odd < 2; ++odd) {
        const int r = 8 * j + 2 * t + odd;
        if (r >= rows) continue;
        const int pair = a.route.pair_of[sorted0 + r];
        const float wgt = a.topk_weights[pair];
        float* dst = a.out + static_cast<size_t>(pair / a.out_div) * a.n;
#pragma unroll
        for (int f = 0; f < 2; ++f) {
          if (col[f] >= a.n) continue;
          atomicAdd(dst + col[f], wgt * fmaf(d[4 * j + 2 * f + odd], unshift[f], feature_bias[f]));
        }
      }
    }
  }
}

}  // namespace flotilla::kernels::cuda::moe_gemm
