#include "kernels/cuda/moe_gemm.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

namespace flotilla::kernels::cuda {
namespace {

constexpr int kThreads = 256;  // 8 warps
constexpr int kBN = 128;       // output features per tile
constexpr int kBK = 64;        // reduction per stage: two MXFP4 blocks
constexpr int kARowBytes = kBK * 2;  // bf16, 8 chunks of 16 bytes, XOR-swizzled by row
// 32 bytes of blocks per weight row and stage, padded to 48 so the fragment
// reads of 8 consecutive rows fall in distinct banks.
constexpr int kBRowBytes = 48;
constexpr int kLutBytes = 256 * 4;
constexpr int kMaxBlocksPerRow = 4096 / 32;

__host__ __device__ constexpr size_t AlignUp(size_t v, size_t a) { return (v + a - 1) / a * a; }

template <int kBM>
__host__ __device__ constexpr int StageBytes() {
  return kBM * kARowBytes + kBN * kBRowBytes;
}

template <int kBM, int kStages>
size_t SharedBytes(int blocks_per_row) {
  return kLutBytes + AlignUp(static_cast<size_t>(kBN) * blocks_per_row, 128) +
         static_cast<size_t>(kStages) * StageBytes<kBM>();
}

struct GemmArgs {
  const uint8_t* blocks;
  const uint8_t* scales;
  const uint16_t* bias;
  int n;  // output features of one expert
  int k;  // reduction length, a multiple of 32
  MoeGemmRoute route;
  const int32_t* tile_expert;
  const int32_t* tile_row0;
  const int32_t* num_tiles;
  int top_k;
  const uint16_t* x;  // gate_up: bf16 [tokens, k]
  uint16_t* h;        // gate_up writes, down reads: bf16 [pairs, I], routing order
  float limit, alpha;
  const float* topk_weights;  // down
  float* out;                 // down: f32 [tokens, n]
};

__device__ __forceinline__ uint32_t SharedAddress(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared; `src_bytes` 0 fills zeros (rows or blocks past the end).
__device__ __forceinline__ void CpAsync16(void* dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(SharedAddress(dst)),
               "l"(src), "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

__device__ __forceinline__ void LdMatrixX4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SharedAddress(p)));
}

__device__ __forceinline__ void Mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Exact: an FP4 value times a power of two is a bf16 (subnormals included).
__device__ __forceinline__ uint32_t MulBf16x2(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("mul.rn.bf16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

// bf16x2 of a byte's two FP4 values: the low nibble (the even element) in
// the low half, as the mma B fragment wants consecutive k.
__device__ uint32_t Fp4PairBf16(uint32_t byte) {
  const float mag[8] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};
  auto bits = [&](uint32_t nib) -> uint32_t {
    const float v = (nib & 8) ? -mag[nib & 7] : mag[nib & 7];
    return __bfloat16_as_ushort(__float2bfloat16_rn(v));
  };
  return bits(byte & 15) | (bits(byte >> 4) << 16);
}

// 2^(s - 127) in both halves of a bf16x2 (the exponent field is s); s = 0
// gives 0, as in the decode path.
__device__ __forceinline__ uint32_t ScalePair(uint32_t s) { return s * 0x00800080u; }

__device__ __forceinline__ float Bf16ToFloat(uint16_t b) {
  return __uint_as_float(static_cast<uint32_t>(b) << 16);
}

// Tiles of kBM rows per expert, in expert order: tile_expert / tile_row0 for
// each, and their number. One block; E <= 1024.
__global__ void __launch_bounds__(1024)
    TileMapKernel(const int32_t* count, int num_experts, int rows_per_tile, int32_t* tile_expert,
                  int32_t* tile_row0, int32_t* num_tiles) {
  __shared__ int32_t warp_sums[32];
  const int e = threadIdx.x, lane = e & 31, warp = e >> 5;
  const int tiles = e < num_experts ? (count[e] + rows_per_tile - 1) / rows_per_tile : 0;
  int incl = tiles;
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const int v = __shfl_up_sync(0xFFFFFFFFu, incl, off);
    if (lane >= off) incl += v;
  }
  if (lane == 31) warp_sums[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    int s = warp_sums[lane];
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
      const int v = __shfl_up_sync(0xFFFFFFFFu, s, off);
      if (lane >= off) s += v;
    }
    warp_sums[lane] = s;
  }
  __syncthreads();
  const int first = (warp > 0 ? warp_sums[warp - 1] : 0) + incl - tiles;
  for (int i = 0; i < tiles; ++i) {
    tile_expert[first + i] = e;
    tile_row0[first + i] = i * rows_per_tile;
  }
  if (e == blockDim.x - 1) *num_tiles = warp_sums[31];
}

// One (row tile, 128 features) tile of one projection; see moe_gemm.h.
// kWarpsM warps split the rows, the other 8 / kWarpsM split the features;
// kStages stages of the reduction are in flight.
template <bool kDown, int kBM, int kWarpsM, int kStages>
__global__ void __launch_bounds__(kThreads, 2) MoeGemmKernel(GemmArgs a) {
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

  uint32_t* lut = reinterpret_cast<uint32_t*>(smem);
  uint8_t* s_scales = smem + kLutBytes;
  uint8_t* stages = s_scales + AlignUp(static_cast<size_t>(kBN) * nb, 128);
  lut[tid] = Fp4PairBf16(static_cast<uint32_t>(tid));

  // The tile's scales, once: [kBN rows][nb]; rows past the end read 2^0 so
  // their zero-filled bytes stay 0.
  const uint8_t* scale_src = a.scales + (static_cast<size_t>(e) * a.n + n0) * nb;
  const int scale_bytes = valid_n * nb;
  if (((reinterpret_cast<uintptr_t>(scale_src) | static_cast<uintptr_t>(scale_bytes)) & 15) == 0) {
    for (int i = tid * 16; i < scale_bytes; i += kThreads * 16) CpAsync16(s_scales + i, scale_src + i, 16);
  } else {
    for (int i = tid; i < scale_bytes; i += kThreads) s_scales[i] = scale_src[i];
  }
  for (int i = scale_bytes + tid; i < kBN * nb; i += kThreads) s_scales[i] = 127;

  // This thread's activation rows (chunk a_chunk of each) and weight half-row.
  const int a_chunk = tid & 7;
  const uint16_t* a_src[kARowsPerThread];
  int a_bytes[kARowsPerThread];
#pragma unroll
  for (int j = 0; j < kARowsPerThread; ++j) {
    const int r = (tid >> 3) + 32 * j;
    const bool ok = r < rows;
    const int s = sorted0 + (ok ? r : 0);
    a_src[j] = kDown ? a.h + static_cast<size_t>(s) * a.k
                     : a.x + static_cast<size_t>(a.route.pair_of[s] / a.top_k) * a.k;
    a_bytes[j] = ok ? 16 : 0;
  }
  const int b_row = tid >> 1, b_half = tid & 1;
  const bool b_row_ok = b_row < valid_n;
  const uint8_t* b_src =
      a.blocks + ((static_cast<size_t>(e) * a.n + n0 + (b_row_ok ? b_row : 0)) * nb + b_half) * 16;

  auto load_stage = [&](int stage, int kt) {
    uint8_t* sa = stages + stage * StageBytes<kBM>();
    uint8_t* sb = sa + kBM * kARowBytes;
    const int kbase = kt * kBK + a_chunk * 8;
    const bool k_ok = kbase < a.k;  // k is a multiple of 32: a chunk is all in or all out
#pragma unroll
    for (int j = 0; j < kARowsPerThread; ++j) {
      const int r = (tid >> 3) + 32 * j;
      CpAsync16(sa + r * kARowBytes + ((a_chunk ^ (r & 7)) << 4), a_src[j] + (k_ok ? kbase : 0),
                k_ok ? a_bytes[j] : 0);
    }
    const bool b_ok = b_row_ok && kt * 2 + b_half < nb;
    CpAsync16(sb + b_row * kBRowBytes + b_half * 16, b_src + (b_ok ? kt * 32 : 0), b_ok ? 16 : 0);
  };

  const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int wm = (warp % kWarpsM) * kWarpRows, wn = (warp / kWarpsM) * kWarpCols;
  float acc[kMi][kNj][4];
#pragma unroll
  for (int i = 0; i < kMi; ++i)
#pragma unroll
    for (int j = 0; j < kNj; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[i][j][c] = 0.f;

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < k_tiles) load_stage(s, s);
    CpAsyncCommit();
  }
  for (int kt = 0; kt < k_tiles; ++kt) {
    CpAsyncWait<kStages - 2>();
    __syncthreads();
    if (kt + kStages - 1 < k_tiles) load_stage((kt + kStages - 1) % kStages, kt + kStages - 1);
    CpAsyncCommit();
    const uint8_t* sa = stages + (kt % kStages) * StageBytes<kBM>();
    const uint8_t* sb = sa + kBM * kARowBytes;
    uint32_t scale[kNj][2];
#pragma unroll
    for (int j = 0; j < kNj; ++j) {
      const int r = wn + 8 * j + g;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int kb = kt * 2 + h;
        scale[j][h] = ScalePair(kb < nb ? s_scales[r * nb + kb] : 127u);
      }
    }
#pragma unroll
    for (int kk = 0; kk < kBK / 16; ++kk) {
      uint32_t af[kMi][4];
#pragma unroll
      for (int i = 0; i < kMi; ++i) {
        const int r = wm + 16 * i + (lane & 15);
        const int chunk = 2 * kk + (lane >> 4);
        LdMatrixX4(af[i], sa + r * kARowBytes + ((chunk ^ (r & 7)) << 4));
      }
#pragma unroll
      for (int j = 0; j < kNj; ++j) {
        // Bytes 8kk + t and 8kk + t + 4 of the row: k = 16kk + 2t, +1 and +8, +9.
        const uint2 wv =
            *reinterpret_cast<const uint2*>(sb + (wn + 8 * j + g) * kBRowBytes + 8 * kk);
        const uint32_t b0 = MulBf16x2(lut[(wv.x >> (8 * t)) & 0xFF], scale[j][kk >> 1]);
        const uint32_t b1 = MulBf16x2(lut[(wv.y >> (8 * t)) & 0xFF], scale[j][kk >> 1]);
#pragma unroll
        for (int i = 0; i < kMi; ++i) Mma(acc[i][j], af[i], b0, b1);
      }
    }
  }
  CpAsyncWait<0>();

  // Epilogue: thread holds rows wm + 16i + g (+8) and features wn + 8j + 2t, +1.
  const uint16_t* bias = a.bias + static_cast<size_t>(e) * a.n;
#pragma unroll
  for (int j = 0; j < kNj; ++j) {
    const int col = n0 + wn + 8 * j + 2 * t;
    if (col >= a.n) continue;
    const float b0 = Bf16ToFloat(bias[col]), b1 = Bf16ToFloat(bias[col + 1]);
#pragma unroll
    for (int i = 0; i < kMi; ++i) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = wm + 16 * i + g + 8 * half;
        if (r >= rows) continue;
        const float v0 = acc[i][j][2 * half] + b0, v1 = acc[i][j][2 * half + 1] + b1;
        if constexpr (!kDown) {
          // Interleaved rows: feature 2m is gate m, 2m + 1 is up m.
          const float gate = fminf(v0, a.limit);
          const float up = fminf(fmaxf(v1, -a.limit), a.limit);
          const float glu = gate * (1.0f / (1.0f + expf(-(gate * a.alpha))));
          const int I = a.n / 2;
          a.h[static_cast<size_t>(sorted0 + r) * I + col / 2] =
              __bfloat16_as_ushort(__float2bfloat16_rn((up + 1.0f) * glu));
        } else {
          const int pair = a.route.pair_of[sorted0 + r];
          const float wgt = a.topk_weights[pair];
          float* dst = a.out + static_cast<size_t>(pair / a.top_k) * a.n + col;
          atomicAdd(dst, wgt * v0);
          atomicAdd(dst + 1, wgt * v1);
        }
      }
    }
  }
}

template <bool kDown, int kBM, int kWarpsM, int kStages>
cudaError_t LaunchProjection(const GemmArgs& args, int max_tiles, cudaStream_t stream) {
  auto kernel = MoeGemmKernel<kDown, kBM, kWarpsM, kStages>;
  const size_t smem = SharedBytes<kBM, kStages>(kMaxBlocksPerRow);
  static bool attribute_set = false;  // once, so later calls may sit in a graph capture
  if (!attribute_set) {
    const cudaError_t err = cudaFuncSetAttribute(
        kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (err != cudaSuccess) return err;
    attribute_set = true;
  }
  const dim3 grid((args.n + kBN - 1) / kBN, static_cast<unsigned>(max_tiles));
  kernel<<<grid, kThreads, SharedBytes<kBM, kStages>(args.k / 32), stream>>>(args);
  return cudaGetLastError();
}

template <int kBM, int kWarpsM, int kStages>
cudaError_t LaunchBoth(GemmArgs gu, GemmArgs dn, int max_tiles, cudaStream_t stream) {
  const cudaError_t err = LaunchProjection<false, kBM, kWarpsM, kStages>(gu, max_tiles, stream);
  if (err != cudaSuccess) return err;
  return LaunchProjection<true, kBM, kWarpsM, kStages>(dn, max_tiles, stream);
}

int MaxTiles(int pairs, int num_experts, int rows_per_tile) {
  return pairs / rows_per_tile + std::min(num_experts, pairs) + 1;
}

}  // namespace

size_t MoeGemmWorkspaceBytes(int num_experts, int intermediate, int pairs) {
  if (pairs <= 0) return 0;
  const size_t tiles = static_cast<size_t>(MaxTiles(pairs, num_experts, 32));
  return AlignUp(static_cast<size_t>(pairs) * intermediate * sizeof(uint16_t), 256) +
         AlignUp((2 * tiles + 1) * sizeof(int32_t), 256);
}

cudaError_t LaunchMoeGemm(const MoeDeviceWeights& w, const uint16_t* x, const float* topk_weights,
                          int tokens, int top_k, float limit, float alpha, MoeGemmRoute route,
                          float* out, void* workspace, int rows_per_tile, cudaStream_t stream) {
  if ((rows_per_tile != 32 && rows_per_tile != 64 && rows_per_tile != 128) || w.num_experts > 1024 ||
      w.hidden % 32 != 0 || w.intermediate % 32 != 0 || w.hidden > 4096 || w.intermediate > 4096) {
    return cudaErrorInvalidValue;
  }
  const int pairs = tokens * top_k;
  if (pairs <= 0) return cudaSuccess;
  auto* base = static_cast<uint8_t*>(workspace);
  auto* h = reinterpret_cast<uint16_t*>(base);
  base += AlignUp(static_cast<size_t>(pairs) * w.intermediate * sizeof(uint16_t), 256);
  const int max_tiles = MaxTiles(pairs, w.num_experts, rows_per_tile);
  auto* tile_expert = reinterpret_cast<int32_t*>(base);
  int32_t* tile_row0 = tile_expert + max_tiles;
  int32_t* num_tiles = tile_row0 + max_tiles;

  TileMapKernel<<<1, 1024, 0, stream>>>(route.count, w.num_experts, rows_per_tile, tile_expert,
                                        tile_row0, num_tiles);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;

  GemmArgs gu{};
  gu.blocks = w.gate_up_blocks, gu.scales = w.gate_up_scales, gu.bias = w.gate_up_bias;
  gu.n = 2 * w.intermediate, gu.k = w.hidden;
  gu.route = route, gu.tile_expert = tile_expert, gu.tile_row0 = tile_row0;
  gu.num_tiles = num_tiles, gu.top_k = top_k;
  gu.x = x, gu.h = h, gu.limit = limit, gu.alpha = alpha;
  GemmArgs dn = gu;
  dn.blocks = w.down_blocks, dn.scales = w.down_scales, dn.bias = w.down_bias;
  dn.n = w.hidden, dn.k = w.intermediate;
  dn.topk_weights = topk_weights, dn.out = out;
  switch (rows_per_tile) {
    case 128:
      return LaunchBoth<128, 2, 3>(gu, dn, max_tiles, stream);
    case 64:
      return LaunchBoth<64, 1, 4>(gu, dn, max_tiles, stream);
    default:
      return LaunchBoth<32, 1, 4>(gu, dn, max_tiles, stream);
  }
}

}  // namespace flotilla::kernels::cuda
