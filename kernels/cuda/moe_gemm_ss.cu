// The 80-row MXFP4 grouped-GEMM tiles with a decoding warpgroup; see
// moe_gemm_tma.h (LaunchMoeGemmTma's decode_to_smem).
//
// A CTA computes one (80-row tile, 128 features) tile as the tensor-map
// kernels do, but its three warpgroups split the work:
// - warpgroups 0 and 1 (the consumers, 64 features each) issue wgmmas with
//   both operands in shared memory (SS): A the decoded f16 weights, B the
//   activation stage, and run the tiles' epilogue (moe_gemm_parts.cuh);
// - warpgroup 2 (the decoder) turns each stage's MXFP4 weights into the
//   f16 A operand (the same values DecodeWord and HalfScale give the
//   register-operand kernels) and stores it in the 128-byte swizzle the
//   wgmma descriptor reads.
// So a consumer holds only its accumulators (no decode registers, no
// serialized wgmmas), and one stage's wgmmas run while the next one decodes.
//
// Three rings of stages, each slot with a full and an empty mbarrier:
// weights (MXFP4, 6 slots, refilled by the decoder's thread 0 once all its
// warps have read a slot), activations (4 slots, refilled by consumer thread
// 0 once both warpgroups' wgmmas on a slot have completed) and decoded
// weights (2 slots). A weight slot is free as soon as it is decoded, so the
// weights stream further ahead than the activations, which stay in shared
// memory until the wgmmas that read them complete.
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "kernels/cuda/fp4.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/moe_gemm_parts.cuh"
#include "kernels/cuda/moe_gemm_tma.h"
#include "kernels/cuda/ptx.cuh"

namespace flotilla::kernels::cuda {
namespace {
using namespace moe_gemm;  // NOLINT(build/namespaces): the GEMMs' shared pieces
using ptx::CpAsync16;
using ptx::CpAsyncCommit;
using ptx::CpAsyncWait;
using ptx::MbarArrive;
using ptx::MbarExpectTx;
using ptx::MbarInit;
using ptx::MbarWait;
using ptx::TmaLoad2D;

constexpr int kBM = 80;          // token rows per tile
constexpr int kBN = 128;         // output features per tile
constexpr int kBK = 64;          // reduction per stage: two MXFP4 blocks
constexpr int kConsumers = 256;  // two warpgroups, 64 features each
constexpr int kDecoders = 128;   // one warpgroup
constexpr int kThreads = kConsumers + kDecoders;
constexpr int kConsumerWarps = kConsumers / 32;
constexpr int kDecoderWarps = kDecoders / 32;
constexpr int kWeightRowBytes = kBK / 2;  // MXFP4, dense
constexpr int kWeightStageBytes = kBN * kWeightRowBytes;
constexpr int kActStageBytes = kBM * kBK * 2;      // f16 rows of 128 bytes, swizzled
constexpr int kDecodedStageBytes = kBN * kBK * 2;  // f16 rows of 128 bytes, swizzled
template <int kW, int kA, int kD>
struct RingDepths {
  static constexpr int kWeightStages = kW, kActStages = kA, kDecodedStages = kD;
};
static_assert(kActStageBytes % 1024 == 0 && kDecodedStageBytes % 1024 == 0,
              "swizzled stages stay on 1024 bytes");

__host__ __device__ constexpr int ScaleBytes(int nb) {
  return static_cast<int>(AlignUp(static_cast<size_t>(kBN) * nb, 16));
}
template <typename C>
size_t SharedBytes(int nb) {
  constexpr int kWeightStages = C::kWeightStages, kActStages = C::kActStages,
                kDecodedStages = C::kDecodedStages;
  constexpr int kBarriers = 2 * (kWeightStages + kActStages + kDecodedStages);
  return 1024 /* alignment slack */ + kDecodedStages * kDecodedStageBytes +
         kActStages * kActStageBytes + kWeightStages * kWeightStageBytes + ScaleBytes(nb) +
         kBarriers * sizeof(uint64_t);
}

// D (64 features x kN tokens, f32, accumulated) += A (desc) * B (desc), both
// K-major with the 128-byte swizzle.
#define FLOTILLA_D8(i)                                                                        \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
      "+f"(d[i + 6]), "+f"(d[i + 7])
template <int kN, int kD>
__device__ __forceinline__ void WgmmaSs(float (&d)[kD], uint64_t a_desc, uint64_t b_desc) {
  static_assert(kD >= kN / 2, "accumulators");
  if constexpr (kN == 80) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %42, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n80k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, "
        "%8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, "
        "%26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39}, %40, %41, p, 1, "
        "1, 0, 0;\n}\n"
        : FLOTILLA_D8(0), FLOTILLA_D8(8), FLOTILLA_D8(16), FLOTILLA_D8(24), FLOTILLA_D8(32)
        : "l"(a_desc), "l"(b_desc), "r"(1));
  } else if constexpr (kN == 64) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, "
        "%8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, "
        "%26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
        : FLOTILLA_D8(0), FLOTILLA_D8(8), FLOTILLA_D8(16), FLOTILLA_D8(24)
        : "l"(a_desc), "l"(b_desc), "r"(1));
  } else {
    static_assert(kN == 32, "wgmma width");
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, "
        "%8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, 0, 0;\n}\n"
        : FLOTILLA_D8(0), FLOTILLA_D8(8)
        : "l"(a_desc), "l"(b_desc), "r"(1));
  }
}
#undef FLOTILLA_D8

__device__ __forceinline__ void WgmmaWaitOne() {
  asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
}

// The shared-memory layout of a CTA and its rings' barriers.
struct Rings {
  uint8_t* decoded;  // kDecodedStages x [kBN rows][128 bytes], swizzled
  uint8_t* act;      // kActStages x [kBM rows][128 bytes], swizzled by the copy
  uint8_t* weights;  // kWeightStages x [kBN rows][kWeightRowBytes]
  uint8_t* scales;   // [kBN rows][nb]
  uint64_t *w_full, *w_empty, *a_full, *a_empty, *d_full, *d_empty;
};

template <typename C>
__device__ __forceinline__ Rings CarveRings(uint8_t* smem, int nb) {
  constexpr int kWeightStages = C::kWeightStages, kActStages = C::kActStages,
                kDecodedStages = C::kDecodedStages;
  const uint32_t off = ptx::SharedAddress(smem) & 1023u;  // the swizzle's period
  if (off != 0) smem += 1024 - off;
  Rings r;
  r.decoded = smem;
  r.act = r.decoded + kDecodedStages * kDecodedStageBytes;
  r.weights = r.act + kActStages * kActStageBytes;
  r.scales = r.weights + kWeightStages * kWeightStageBytes;
  auto* bars = reinterpret_cast<uint64_t*>(r.scales + ScaleBytes(nb));
  r.w_full = bars, r.w_empty = r.w_full + kWeightStages;
  r.a_full = r.w_empty + kWeightStages, r.a_empty = r.a_full + kActStages;
  r.d_full = r.a_empty + kActStages, r.d_empty = r.d_full + kDecodedStages;
  return r;
}

// The decoder warpgroup: stage by stage, each thread's four feature rows
// (32 dw + 16 v + g + 8 h for v, h in {0, 1}; lane (g, t) of decoder warp
// dw) decoded as the register-operand kernels' A fragments and stored where
// the wgmma descriptor of the consumer holding the row reads them.
template <typename C, typename LoadWeights>
__device__ __forceinline__ void DecodeStages(const Rings& r, int nb, int k_tiles,
                                             LoadWeights load_weights) {
  constexpr int kWeightStages = C::kWeightStages, kDecodedStages = C::kDecodedStages;
  const int dt = threadIdx.x - kConsumers;
  const int lane = dt & 31, dw = dt >> 5, g = lane >> 2, t = lane & 3;
  int row[4], shift[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    row[i] = 32 * dw + 16 * (i >> 1) + g + 8 * (i & 1);
    shift[i] = RowShift(r.scales + row[i] * nb, nb);
  }
  for (int kt = 0; kt < k_tiles; ++kt) {
    const int ws = kt % kWeightStages;
    MbarWait(&r.w_full[ws], (kt / kWeightStages) & 1);
    const uint8_t* sb = r.weights + ws * kWeightStageBytes;
    const int kb = kt * 2 + (t >> 1);
    uint2 words[4];
    uint32_t scale[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      words[i] = *reinterpret_cast<const uint2*>(sb + row[i] * kWeightRowBytes + 8 * t);
      scale[i] = kb < nb ? r.scales[row[i] * nb + kb] : 0u;
    }
    __syncwarp();
    if (lane == 0) MbarArrive(&r.w_empty[ws]);
    if (dt == 0 && kt + kWeightStages < k_tiles) {
      MbarWait(&r.w_empty[ws], (kt / kWeightStages) & 1);
      load_weights(kt + kWeightStages);
    }
    const int ds = kt % kDecodedStages;
    if (kt >= kDecodedStages) MbarWait(&r.d_empty[ds], ((kt / kDecodedStages) - 1) & 1);
    uint8_t* dst = r.decoded + ds * kDecodedStageBytes;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t sc = HalfScale(scale[i], shift[i]);
      uint8_t* out = dst + row[i] * 128 + 4 * t;
      const int sw = row[i] & 7;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const Fp4Pairs p = DecodeWord(half == 0 ? words[i].x : words[i].y);
#pragma unroll
        for (int k2 = 0; k2 < 2; ++k2) {
          const int kk = 2 * half + k2;  // k16 step: values 16 kk + 2t (+8)
          *reinterpret_cast<uint32_t*>(out + (((2 * kk) ^ sw) << 4)) = MulHalf2(p.p[2 * k2], sc);
          *reinterpret_cast<uint32_t*>(out + (((2 * kk + 1) ^ sw) << 4)) =
              MulHalf2(p.p[2 * k2 + 1], sc);
        }
      }
    }
    // The stores are the generic proxy's; the wgmmas read through the async one.
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    MbarArrive(&r.d_full[ds]);
  }
}

// A consumer warpgroup's main loop with wgmmas kN rows wide: stage kt's
// wgmmas issue once its activations have landed and its weights are
// decoded; then stage kt - 1's have completed, and its slots go back.
template <typename C, int kN, typename LoadAct>
__device__ __forceinline__ void ConsumeStages(const Rings& r, int k_tiles, float (&d)[kBM / 2],
                                              LoadAct load_act) {
  constexpr int kActStages = C::kActStages, kDecodedStages = C::kDecodedStages;
  const int wg = threadIdx.x >> 7;
  const uint64_t a_desc0 = SmemDescSw128(r.decoded + wg * 64 * 128);
  const uint64_t b_desc0 = SmemDescSw128(r.act);
  const bool lane0 = (threadIdx.x & 31) == 0;
  FenceAccumulators(d);
  for (int kt = 0; kt < k_tiles; ++kt) {
    const int as = kt % kActStages, ds = kt % kDecodedStages;
    MbarWait(&r.a_full[as], (kt / kActStages) & 1);
    MbarWait(&r.d_full[ds], (kt / kDecodedStages) & 1);
    WgmmaFence();
    const uint64_t a_desc = a_desc0 + static_cast<uint64_t>(ds * (kDecodedStageBytes >> 4));
    const uint64_t b_desc = b_desc0 + static_cast<uint64_t>(as * (kActStageBytes >> 4));
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) WgmmaSs<kN>(d, a_desc + 2 * kk, b_desc + 2 * kk);  // +32 bytes
    WgmmaCommit();
    WgmmaWaitOne();
    if (kt == 0) continue;
    const int prev = kt - 1, ps = prev % kActStages;
    if (lane0) {
      MbarArrive(&r.a_empty[ps]);
      MbarArrive(&r.d_empty[prev % kDecodedStages]);
    }
    if (threadIdx.x == 0 && prev + kActStages < k_tiles) {
      MbarWait(&r.a_empty[ps], (prev / kActStages) & 1);
      load_act(prev + kActStages);
    }
  }
  WgmmaWaitAll();
  FenceAccumulators(d);
}

template <bool kDown, typename C>
__global__ void __launch_bounds__(kThreads, 2)
    MoeGemmSsKernel(const __grid_constant__ CUtensorMap act_map,
                    const __grid_constant__ CUtensorMap w_map, GemmArgs a, bool overlapping) {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  auto wait_for_previous = [&] {
    if (overlapping) asm volatile("griddepcontrol.wait;" ::: "memory");
  };
  const int tile = blockIdx.y;
  if (tile >= *a.num_tiles) {
    wait_for_previous();
    return;
  }
  extern __shared__ __align__(16) uint8_t smem[];
  const int nb = a.k / 32;
  const Rings r = CarveRings<C>(smem, nb);
  constexpr int kWeightStages = C::kWeightStages, kActStages = C::kActStages,
                kDecodedStages = C::kDecodedStages;
  const int e = a.tile_expert[tile];
  const int row0 = a.tile_row0[tile];
  const int rows = min(kBM, a.route.count[e] - row0);
  const int sorted0 = a.route.offset[e] + row0;
  const int n0 = blockIdx.x * kBN;
  const int valid_n = min(kBN, a.n - n0);
  const int k_tiles = (a.k + kBK - 1) / kBK;
  const int tid = threadIdx.x;
  const int w_row = e * a.n + n0;
  auto load_weights = [&](int kt) {
    const int s = kt % kWeightStages;
    MbarExpectTx(&r.w_full[s], kWeightStageBytes);
    TmaLoad2D(r.weights + s * kWeightStageBytes, &w_map, kt * kWeightRowBytes, w_row, &r.w_full[s]);
  };
  auto load_act = [&](int kt) {
    const int s = kt % kActStages;
    MbarExpectTx(&r.a_full[s], kActStageBytes);
    TmaLoad2D(r.act + s * kActStageBytes, &act_map, kt * kBK, sorted0, &r.a_full[s]);
  };
  if (tid == 0) {
    for (int i = 0; i < kWeightStages; ++i) MbarInit(&r.w_full[i], 1);
    for (int i = 0; i < kWeightStages; ++i) MbarInit(&r.w_empty[i], kDecoderWarps);
    for (int i = 0; i < kActStages; ++i) MbarInit(&r.a_full[i], 1);
    for (int i = 0; i < kActStages; ++i) MbarInit(&r.a_empty[i], kConsumerWarps);
    for (int i = 0; i < kDecodedStages; ++i) MbarInit(&r.d_full[i], kDecoders);
    for (int i = 0; i < kDecodedStages; ++i) MbarInit(&r.d_empty[i], kConsumerWarps);
    for (int kt = 0; kt < kWeightStages && kt < k_tiles; ++kt) load_weights(kt);
    for (int kt = 0; kt < kActStages && kt < k_tiles; ++kt) load_act(kt);
  }
  // The tile's scales: [kBN rows][nb]; rows past the end are never used.
  const uint8_t* scale_src = a.scales + (static_cast<size_t>(e) * a.n + n0) * nb;
  for (int i = tid * 16; i < valid_n * nb; i += kThreads * 16)
    CpAsync16(r.scales + i, scale_src + i, 16);
  CpAsyncCommit();
  CpAsyncWait<0>();
  __syncthreads();  // the scales and the barriers' init

  if (tid >= kConsumers) {
    DecodeStages<C>(r, nb, k_tiles, load_weights);
    wait_for_previous();
    return;
  }
  const int f0 = WgmmaFeatureRow();
  const int c0 = RowShift(r.scales + f0 * nb, nb), c1 = RowShift(r.scales + (f0 + 8) * nb, nb);
  float d[kBM / 2];
#pragma unroll
  for (int i = 0; i < kBM / 2; ++i) d[i] = 0.f;
  // Only the rows the tile holds go through the tensor cores.
  const int width = WgmmaWidth<kBM>(rows);
  if (width > 64) {
    ConsumeStages<C, 80>(r, k_tiles, d, load_act);
  } else if (width > 32) {
    ConsumeStages<C, 64>(r, k_tiles, d, load_act);
  } else {
    ConsumeStages<C, 32>(r, k_tiles, d, load_act);
  }
  WgmmaEpilogue<kDown, kBM>(a, d, e, n0, rows, sorted0, c0, c1);
  wait_for_previous();
}

}  // namespace

cudaError_t LaunchMoeGemmSs(bool down, const GemmArgs& a, int num_experts, int max_tiles,
                            const uint16_t* act, int act_rows, cudaStream_t stream,
                            bool overlapping) {
  CUtensorMap act_map{}, w_map{};
  cudaError_t err = MoeGemmTensorMaps(a, num_experts, act, act_rows, kBM, &act_map, &w_map);
  if (err != cudaSuccess) return err;
  auto go = [&](auto c) {
    using C = decltype(c);
    auto kernel = down ? MoeGemmSsKernel<true, C> : MoeGemmSsKernel<false, C>;
    const size_t smem = SharedBytes<C>(a.k / 32);
    static PerDevice<size_t> allowed[2];
    cudaError_t e2 = AllowSharedBytes(kernel, smem, &allowed[down ? 1 : 0]);
    if (e2 != cudaSuccess) return e2;
    const dim3 grid((a.n + kBN - 1) / kBN, static_cast<unsigned>(max_tiles));
    return LaunchPdl(kernel, grid, dim3(kThreads), smem, stream, overlapping, act_map, w_map, a,
                     overlapping);
  };
  return go(RingDepths<6, 4, 2>{});
}

}  // namespace flotilla::kernels::cuda
