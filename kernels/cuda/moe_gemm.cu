#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/cuda/fp4.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/moe_gemm.h"
#include "kernels/cuda/moe_gemm_parts.cuh"
#include "kernels/cuda/moe_gemm_tma.h"
#include "kernels/cuda/ptx.cuh"
#include "kernels/cuda/side_stream.h"

namespace flotilla::kernels::cuda {
namespace {
using namespace moe_gemm;  // NOLINT(build/namespaces): the GEMMs' shared pieces
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

// dst[r, :] (f16, row length kp, a multiple of 64) = src[r, :] (bf16, length
// k) in the permuted order of each 64-group, zeros past k. Exact for |x| in
// f16's normal range, as in the decode kernels. With `pair_of`, rows are
// gathered into routing order instead: dst[r] = src[pair_of[r] / top_k] for
// the r < *num_valid routed pairs (the TMA kernels' x).
constexpr int kPermuteThreads = 256;

__global__ void __launch_bounds__(kPermuteThreads)
    PermuteRowsKernel(const uint16_t* src, int rows, int k, int kp, uint16_t* dst,
                      const int32_t* pair_of = nullptr, const int32_t* num_valid = nullptr,
                      int top_k = 1) {
  if (num_valid != nullptr) rows = *num_valid;
  // A warp takes four consecutive 64-groups of dst (rows are kp = 64 * groups
  // long, so dst group G starts at 64 G), a lane one 16-byte chunk of one:
  // the warp's loads and stores are 512 contiguous bytes (less at a row's
  // end). The groups' source values go through the warp's shared-memory
  // slots (160 bytes each, so that the eight value reads of a chunk fall in
  // distinct banks across the four groups), from which each lane gathers its
  // chunk's eight values in the permuted order. Groups that reach past k (or
  // rows that are not 16-byte aligned) go a value at a time. (Before: a
  // thread per group with 16-byte loads and stores 128 bytes apart across
  // the warp, ~60 us of a 2048-token prefill layer on an H200.)
  constexpr int kSlotChunks = 10;  // 128 bytes of values + 32 of padding
  __shared__ uint4 slots[kPermuteThreads / 32][4][kSlotChunks];
  const int groups = kp / 64;
  const bool vectors = k % 8 == 0 && reinterpret_cast<uintptr_t>(src) % 16 == 0;
  const int total = rows * groups;
  const int lane = threadIdx.x & 31, q = lane >> 3, c = lane & 7;
  uint4* slot = slots[threadIdx.x >> 5][q];
  const auto* slot_values = reinterpret_cast<const uint16_t*>(slot);
  const int warps = gridDim.x * (kPermuteThreads / 32);
  for (int base = (blockIdx.x * kPermuteThreads + threadIdx.x) / 32 * 4; base < total;
       base += warps * 4) {
    const int G = base + q;
    const bool valid = G < total;
    const int r = valid ? G / groups : 0, g0 = (G - r * groups) * 64;
    const size_t row = !valid ? 0 : pair_of != nullptr ? pair_of[r] / top_k : r;
    const uint16_t* s = src + row * k + g0;
    uint16_t* d = dst + static_cast<size_t>(G) * 64 + 8 * c;
    const bool whole = valid && vectors && g0 + 64 <= k;
    if (whole) slot[c] = reinterpret_cast<const uint4*>(s)[c];
    __syncwarp();
    if (whole) {
      // Value j of the group as f32 (bf16 is f32's high half).
      auto value = [&](int j) {
        return __uint_as_float(static_cast<uint32_t>(slot_values[PhysicalOf(j)]) << 16);
      };
      uint32_t out[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const __half2 h = __floats2half2_rn(value(8 * c + 2 * i), value(8 * c + 2 * i + 1));
        out[i] = *reinterpret_cast<const uint32_t*>(&h);
      }
      *reinterpret_cast<uint4*>(d) = make_uint4(out[0], out[1], out[2], out[3]);
    } else if (valid) {
      for (int i = 0; i < 8; ++i) {
        const int p = g0 + PhysicalOf(8 * c + i);
        d[i] = p < k ? __half_as_ushort(__float2half_rn(Bf16ToFloat(s[p - g0]))) : uint16_t{0};
      }
    }
    __syncwarp();  // the slots are refilled next
  }
}

// Its launch over `rows` rows (at most, when gathering).
cudaError_t LaunchPermuteRows(const uint16_t* src, int rows, int k, int kp, uint16_t* dst,
                              cudaStream_t stream, const int32_t* pair_of = nullptr,
                              const int32_t* num_valid = nullptr, int top_k = 1) {
  const size_t n = static_cast<size_t>(rows) * (kp / 64) * 8;  // a lane per 16-byte chunk
  PermuteRowsKernel<<<static_cast<unsigned>(
                          std::min<size_t>((n + kPermuteThreads - 1) / kPermuteThreads, 4096)),
                      kPermuteThreads, 0, stream>>>(src, rows, k, kp, dst, pair_of, num_valid,
                                                    top_k);
  return cudaGetLastError();
}

// The tile maps, in expert order, of an expert's rows: tiles of rows_per_tile
// rows (ExpertTileRows at 160; tile_expert / tile_row0, num_tiles), except
// that a last, partly filled
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
  const int tile_rows = ExpertTileRows(c, rows_per_tile);
  const int rest = c % tile_rows;
  const bool split = small_max > 0 && rest > 0 && rest <= small_max;
  const int big = c / tile_rows + (rest > 0 && !split ? 1 : 0);
  const int small = split ? (rest + small_rows - 1) / small_rows : 0;
  const int first = BlockExclusiveScan(big, warp_sums, &totals[0]);
  const int first_small = BlockExclusiveScan(small, warp_sums, &totals[1]);
  for (int i = 0; i < big; ++i) {
    tile_expert[first + i] = e;
    tile_row0[first + i] = i * tile_rows;
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

// The wgmma main loop of MoeGemmKernel<..., kWgmma = true>, the first
// kStages - 1 stages already requested: d = the tile's features x rows, rows
// f0 and f0 + 8 times 2^-c0 and 2^-c1 (HalfScale).
template <int kBM, int kActs, int kStages, typename LoadStage>
__device__ __forceinline__ void WgmmaMainLoop(LoadStage& load_next, uint8_t* stages,
                                              const uint8_t* s_scales, int k_tiles, int nb, int c0,
                                              int c1, bool low, float (&d)[kBM / 2]) {
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
    WgmmaStage<kBM, kBRowBytes>(sa, sa + kActs * kBM * kARowBytes, s_scales, nb, kt, c0, c1,
                                kActs == 2 && low ? sa + kBM * kARowBytes : nullptr, d);
  }
  CpAsyncWait<0>();
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

double MoeGemmPassesSavedBy160Rows(double rows_per_expert) {
  const double m = rows_per_expert;
  if (!(m > 0)) return 0.0;
  const double sd = std::sqrt(m);
  const int lo = std::max(0, static_cast<int>(m - 10 * sd));
  const int hi = static_cast<int>(m + 10 * sd) + 1;
  double saved = 0.0;
  for (int c = lo; c <= hi; ++c) {
    const int passes_128 = (c + 127) / 128;
    const int passes = (c + ExpertTileRows(c, 160) - 1) / ExpertTileRows(c, 160);
    if (passes >= passes_128) continue;
    const double p = std::exp(c * std::log(m) - m - std::lgamma(c + 1.0));
    saved += p * (passes_128 - passes);
  }
  return saved;
}

bool MoeGemmPrefers160Rows(int64_t pairs, int num_experts) {
  if (pairs <= 0 || num_experts <= 0) return false;
  // Every layer of a step asks with the same sizes: the sum (a few hundred
  // terms) runs once per step per thread, not once per layer.
  thread_local int64_t last_pairs = -1;
  thread_local int last_experts = -1;
  thread_local bool last = false;
  if (pairs != last_pairs || num_experts != last_experts) {
    last = MoeGemmPassesSavedBy160Rows(static_cast<double>(pairs) / num_experts) >= 0.15;
    last_pairs = pairs, last_experts = num_experts;
  }
  return last;
}

size_t MoeGemmWorkspaceBytes(const MoeDeviceWeights& w, int tokens, int top_k) {
  const int pairs = tokens * top_k;
  if (pairs <= 0) return 0;
  const size_t tiles = static_cast<size_t>(MaxTiles(pairs, w.num_experts, 32)) +
                       static_cast<size_t>(MaxSmallTiles(pairs, w.num_experts));
  const size_t h_bytes =
      AlignUp(static_cast<size_t>(pairs) * Padded64(w.intermediate) * sizeof(uint16_t), 256);
  // h, then h's low parts or (the TMA kernels) the gathered x.
  return h_bytes + std::max(h_bytes, MoeGemmTmaGatherBytes(w, pairs)) +
         AlignUp(static_cast<size_t>(tokens) * Padded64(w.hidden) * sizeof(uint16_t), 256) +
         AlignUp((2 * tiles + 2) * sizeof(int32_t), 256);
}

namespace {

// The tile maps in the workspace (TileMapKernel's outputs): big tiles of
// rows_per_tile rows, and an expert's remainder as small tiles.
struct TileLists {
  int32_t *tile_expert, *tile_row0, *num_tiles;
  int32_t *small_expert, *small_row0, *num_small;
  int max_tiles, max_small;
  int small_rows, small_max;  // TileMapKernel's small_rows / small_max
};

// Both projections' arguments, for the big tiles and the small ones.
struct Projections {
  GemmArgs gu, dn, gu_small, dn_small;
};

Projections MakeProjections(const MoeDeviceWeights& w, const float* topk_weights, int top_k,
                            float limit, float alpha, MoeGemmRoute route, float* out,
                            const uint16_t* xp, uint16_t* h, uint16_t* h_lo, const TileLists& t,
                            int rows_per_tile, bool out_per_pair, bool h_low_part) {
  Projections p;
  GemmArgs& gu = p.gu;
  gu.blocks = w.gate_up_blocks, gu.scales = w.gate_up_scales, gu.bias = w.gate_up_bias;
  gu.n = 2 * w.intermediate, gu.k = w.hidden, gu.kp = Padded64(w.hidden);
  gu.route = route, gu.tile_expert = t.tile_expert, gu.tile_row0 = t.tile_row0;
  gu.num_tiles = t.num_tiles, gu.top_k = top_k;
  gu.x = xp, gu.h = h, gu.h_lo = h_lo, gu.h_stride = Padded64(w.intermediate);
  gu.limit = limit, gu.alpha = alpha;
  GemmArgs& dn = p.dn;
  dn = gu;
  dn.blocks = w.down_blocks, dn.scales = w.down_scales, dn.bias = w.down_bias;
  dn.n = w.hidden, dn.k = w.intermediate, dn.kp = Padded64(w.intermediate);
  dn.topk_weights = topk_weights, dn.out = out, dn.out_div = out_per_pair ? 1 : top_k;
  p.gu_small = gu, p.dn_small = dn;
  // Only 32-row down kernels read h's low parts: gate_up writes them for the
  // rows those kernels will take (all of them, or the remainders, which run
  // as 32-row kernels when small_rows is 32 or less). The tensor-map kernels'
  // gathered x lives where the low parts would: nothing else may write there.
  if (!h_low_part) gu.h_lo = p.gu_small.h_lo = dn.h_lo = p.dn_small.h_lo = nullptr;
  if (rows_per_tile != 32) gu.h_lo = nullptr;
  if (t.small_rows > 32) p.gu_small.h_lo = nullptr;
  p.gu_small.tile_expert = p.dn_small.tile_expert = t.small_expert;
  p.gu_small.tile_row0 = p.dn_small.tile_row0 = t.small_row0;
  p.gu_small.num_tiles = p.dn_small.num_tiles = t.num_small;
  return p;
}

// gate_up (big tiles, then the remainders) before down reads h, a CTA per
// tile fed by cp.async. Stages: 8 for 32-row tiles and 6 for 64 (2 CTAs per
// SM) measured no better than 4 (3 CTAs per SM), nor did L2::256B prefetch
// hints on the copies: small tiles are bound by the decode's instructions,
// not by the bytes in flight.
cudaError_t LaunchCpAsyncProjections(const Projections& p, const TileLists& t, int rows_per_tile,
                                     bool wgmma, cudaStream_t stream) {
  for (const bool down : {false, true}) {
    const GemmArgs& big = down ? p.dn : p.gu;
    cudaError_t err;
    switch (rows_per_tile) {
      case 128:
        err = wgmma ? LaunchProjection<128, 2, 4, true>(down, big, t.max_tiles, stream)
                    : LaunchProjection<128, 2, 4>(down, big, t.max_tiles, stream);
        break;
      case 64:
        err = wgmma ? LaunchProjection<64, 1, 4, true>(down, big, t.max_tiles, stream)
                    : LaunchProjection<64, 1, 4>(down, big, t.max_tiles, stream);
        break;
      default:
        err = wgmma ? LaunchProjection<32, 1, 4, true>(down, big, t.max_tiles, stream)
                    : LaunchProjection<32, 1, 4>(down, big, t.max_tiles, stream);
        break;
    }
    if (err == cudaSuccess && t.small_max > 0) {
      const GemmArgs& small = down ? p.dn_small : p.gu_small;
      err = t.small_rows == 64 ? LaunchProjection<64, 1, 4, true>(down, small, t.max_small, stream)
            : wgmma            ? LaunchProjection<32, 1, 4, true>(down, small, t.max_small, stream)
                               : LaunchProjection<32, 1, 4>(down, small, t.max_small, stream);
    }
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

// The same with tensor-map-fed tiles (moe_gemm_tma.h): x gathered into
// routing order first (PermuteRowsKernel with the pairs); 16-row remainders (of 32-row steps) run
// as 32-row tiles.
//
// With remainder tiles, a projection is two launches, the big tiles and the
// remainders. In one stream the second may start only once every CTA of the
// first has started (it overlaps the first one's last wave), and the big
// tiles' grid is sized on the host: when its real tiles fill the SMs, the
// rest of its grid (CTAs that find no tile and exit) waits for a wave of
// big tiles to end, and the remainders wait with it (H200, 2,048-token
// prefill: 60-100 us a projection with most SMs idle). An expert's big tiles
// and its remainder tiles read and write different rows of h, so with
// `two_streams` the big tiles' gate_up and down run on the side stream
// beside the remainders' on `stream`, joined at the end. The side stream's
// priority puts the big tiles (the longest CTAs) first: at equal priority
// the remainders' grid took the SMs first whichever stream it was on, and
// the big tiles, finding SMs only once all of it had started, ran as the
// projection's tail.
cudaError_t LaunchTmaProjections(const Projections& p, const TileLists& t, int rows_per_tile,
                                 const MoeDeviceWeights& w, const uint16_t* x, int pairs,
                                 uint16_t* x_gathered, bool two_streams, cudaStream_t stream) {
  const GemmArgs& gu = p.gu;
  cudaError_t err = LaunchPermuteRows(x, pairs, w.hidden, gu.kp, x_gathered, stream,
                                      gu.route.pair_of, gu.route.offset + w.num_experts, gu.top_k);
  if (err != cudaSuccess) return err;
  const int small_rows = std::max(t.small_rows, 32);
  auto act_of = [&](bool down) -> const uint16_t* { return down ? p.dn.h : x_gathered; };
  SideStream side;
  if (two_streams && t.small_max > 0 && CurrentSideStream(stream, &side) == cudaSuccess) {
    err = ForkToSide(stream, side);
    for (const bool down : {false, true}) {
      if (err == cudaSuccess) {
        err = LaunchMoeGemmTma(down, down ? p.dn : p.gu, w.num_experts, rows_per_tile, t.max_tiles,
                               act_of(down), pairs, side.stream);
      }
      if (err == cudaSuccess) {
        err = LaunchMoeGemmTma(down, down ? p.dn_small : p.gu_small, w.num_experts, small_rows,
                               t.max_small, act_of(down), pairs, stream);
      }
    }
    const cudaError_t join = JoinFromSide(stream, side);  // even after an error
    return err != cudaSuccess ? err : join;
  }
  for (const bool down : {false, true}) {
    if (err == cudaSuccess) {
      err = LaunchMoeGemmTma(down, down ? p.dn : p.gu, w.num_experts, rows_per_tile, t.max_tiles,
                             act_of(down), pairs, stream);
    }
    if (err == cudaSuccess && t.small_max > 0) {
      err = LaunchMoeGemmTma(down, down ? p.dn_small : p.gu_small, w.num_experts, small_rows,
                             t.max_small, act_of(down), pairs, stream, /*overlapping=*/true);
    }
  }
  return err;
}

}  // namespace

cudaError_t LaunchMoeGemm(const MoeDeviceWeights& w, const uint16_t* x, const float* topk_weights,
                          int tokens, int top_k, float limit, float alpha, MoeGemmRoute route,
                          float* out, void* workspace, const MoeGemmOptions& o,
                          cudaStream_t stream) {
  const bool wgmma = o.wgmma;
  if ((o.rows_per_tile != 32 && o.rows_per_tile != 64 && o.rows_per_tile != 128 &&
       o.rows_per_tile != 160) ||
      w.num_experts > 1024 || w.hidden % 32 != 0 || w.intermediate % 32 != 0 || w.hidden > 4096 ||
      w.intermediate > 4096) {
    return cudaErrorInvalidValue;
  }
  // 160-row tiles exist only as tensor-map kernels (below): the others take 128.
  const bool tma_ok = wgmma && o.tma && MoeGemmTmaSupports(w);
  const int rows_per_tile = o.rows_per_tile == 160 && !tma_ok ? 128 : o.rows_per_tile;
  const int pairs = tokens * top_k;
  if (pairs <= 0) return cudaSuccess;
  const int hp = Padded64(w.hidden), ip = Padded64(w.intermediate);
  auto* base = static_cast<uint8_t*>(workspace);
  const size_t h_bytes = AlignUp(static_cast<size_t>(pairs) * ip * sizeof(uint16_t), 256);
  auto* h = reinterpret_cast<uint16_t*>(base);
  auto* h_lo = reinterpret_cast<uint16_t*>(base + h_bytes);
  auto* x_gathered = h_lo;  // the TMA kernels' x; they run where h has no low parts
  base += h_bytes + std::max(h_bytes, MoeGemmTmaGatherBytes(w, pairs));
  auto* xp = reinterpret_cast<uint16_t*>(base);
  base += AlignUp(static_cast<size_t>(tokens) * hp * sizeof(uint16_t), 256);
  TileLists t;
  // At 160 rows an expert's big tiles may be 128 high (ExpertTileRows).
  t.max_tiles = MaxTiles(pairs, w.num_experts, std::min(rows_per_tile, 128));
  t.max_small = MaxSmallTiles(pairs, w.num_experts);
  t.tile_expert = reinterpret_cast<int32_t*>(base);
  t.tile_row0 = t.tile_expert + t.max_tiles;
  t.num_tiles = t.tile_row0 + t.max_tiles;
  t.small_expert = t.num_tiles + 1;
  t.small_row0 = t.small_expert + t.max_small;
  t.num_small = t.small_row0 + t.max_small;
  // Remainders of up to half a big tile go to half-height tiles (32 rows
  // without wgmma), which decode the same weights for less tensor-core work.
  // H200, 120b layer, with -> without: 1024 tokens 1066 -> 1197 us, 2048
  // tokens 1813 -> 1795, 4096 tokens 2746 -> 2789.
  t.small_rows = wgmma ? rows_per_tile / 2 : 32;
  t.small_max = o.remainder_tiles && rows_per_tile > t.small_rows ? rows_per_tile / 2 : 0;

  // Steps whose h carries no low parts may take the tensor-map-fed kernels
  // (moe_gemm_tma.h), which read x gathered in routing order.
  const bool low_parts =
      o.h_low_part && (rows_per_tile == 32 || (t.small_rows == 32 && t.small_max > 0));
  const bool use_tma = tma_ok && !low_parts;
  if (use_tma && rows_per_tile >= 128 && t.small_max > 0) {
    // The tensor-map kernels take remainders of up to 80 rows as 80-row
    // tiles (three CTAs per SM, wgmmas 32, 64 or 80 rows wide) rather than
    // 65-80-row ones as 128-row tiles (two per SM, 96 wide): at 2,048
    // tokens nearly every expert holds 50-80 pairs. H200, 120b layer,
    // against 64-row remainders: 2,048 tokens 1,155-1,158 / 1,224-1,240 us,
    // 2,560 tokens 1,328-1,344 / 1,443-1,472.
    t.small_rows = t.small_max = 80;
  }
  if (!use_tma) LaunchPermuteRows(x, tokens, w.hidden, hp, xp, stream);
  TileMapKernel<<<1, 1024, 0, stream>>>(route.count, w.num_experts, rows_per_tile, t.small_max,
                                        t.small_rows, t.tile_expert, t.tile_row0, t.num_tiles,
                                        t.small_expert, t.small_row0, t.num_small);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  if (ip != w.intermediate) {
    // The padding of h's rows is never written by gate_up: it must read 0.
    err = cudaMemsetAsync(h, 0, 2 * h_bytes, stream);  // and h_lo
    if (err != cudaSuccess) return err;
  }
  const Projections p = MakeProjections(w, topk_weights, top_k, limit, alpha, route, out, xp, h,
                                        h_lo, t, rows_per_tile, o.out_per_pair, o.h_low_part);
  return use_tma ? LaunchTmaProjections(p, t, rows_per_tile, w, x, pairs, x_gathered, o.two_streams,
                                        stream)
                 : LaunchCpAsyncProjections(p, t, rows_per_tile, wgmma, stream);
}

}  // namespace flotilla::kernels::cuda
