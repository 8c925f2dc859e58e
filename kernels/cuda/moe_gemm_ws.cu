// The warp-specialized persistent MXFP4 grouped GEMMs; see moe_gemm_ws.h.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <mutex>

#include "kernels/cuda/fp4.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/moe_gemm_parts.cuh"
#include "kernels/cuda/moe_gemm_ws.h"
#include "kernels/cuda/ptx.cuh"

namespace flotilla::kernels::cuda {
namespace {
using namespace moe_gemm;  // NOLINT(build/namespaces): the GEMMs' shared pieces
using ptx::CpAsync16;
using ptx::MbarArrive;
using ptx::MbarArriveOnCpAsync;
using ptx::MbarExpectTx;
using ptx::MbarInit;
using ptx::MbarWait;
using ptx::TmaLoad2D;

// Per tile height: the consumer warpgroups (each 64 features of a unit) and
// the register split. 128-row tiles keep 64 accumulators and two fragment
// sets per thread, which 3 consumer warpgroups' share of the register file
// (152) cannot hold without ptxas serializing the wgmmas; 2 can (232).
template <int kBM>
struct Shape {
  static constexpr int kGroups = kBM == 128 ? 2 : 3;
  static constexpr int kFeatures = 64 * kGroups;  // output features per unit
  static constexpr int kConsumerWarps = 4 * kGroups;
  // + the producer warpgroup: one warp of it copies, the others leave at once
  // (a whole warpgroup, so that setmaxnreg can hand its registers to the
  // consumers).
  static constexpr int kThreads = 128 * (kGroups + 1);
  static constexpr int kProducerRegisters = 40;
  static constexpr int kConsumerRegisters = kGroups == 2 ? 232 : 152;
  static_assert(kProducerRegisters * 128 + kConsumerRegisters * 32 * kConsumerWarps <= 65536,
                "the register file");
};
constexpr int kBK = 64;                // reduction per stage: two MXFP4 blocks
constexpr int kActRowBytes = kBK * 2;  // f16, 128-byte swizzled by the copy
constexpr int kWeightRowBytes = kBK / 2;

template <int kBM>
__host__ __device__ constexpr int StageBytes() {
  return kBM * kActRowBytes + Shape<kBM>::kFeatures * kWeightRowBytes;
}
// Stages in flight (they fit beside two units' scales up to nb = 128).
template <int kBM>
constexpr int Stages() {
  return 8;
}
static_assert(StageBytes<128>() % 1024 == 0 && StageBytes<64>() % 1024 == 0,
              "stages keep the activation tiles on 1024 bytes (the swizzle's period)");

template <int kBM>
__host__ __device__ constexpr int ScaleBufferBytes(int nb) {
  return static_cast<int>(AlignUp(static_cast<size_t>(Shape<kBM>::kFeatures) * nb, 16));
}
template <int kBM>
size_t SharedBytes(int nb) {
  constexpr int kS = Stages<kBM>();
  return 1024 /* alignment slack */ + static_cast<size_t>(kS) * StageBytes<kBM>() +
         2 * static_cast<size_t>(ScaleBufferBytes<kBM>(nb)) + (2 * kS + 4) * sizeof(uint64_t);
}

struct WsArgs {
  GemmArgs a;
  const int32_t* small_expert;
  const int32_t* small_row0;
  const int32_t* num_small;
  int feature_tiles;  // ceil(n / Shape<kBM>::kFeatures)
  int k_tiles;        // ceil(k / kBK)
};

// A unit of work: row tile `tile` (big tiles first, then the small ones) x
// feature tile `ft`.
struct Unit {
  int e, row0, n0;
  bool small;
};
template <int kBM>
__device__ __forceinline__ Unit UnitOf(const WsArgs& w, int u, int num_big) {
  const int tile = u / w.feature_tiles;
  Unit r;
  r.n0 = (u - tile * w.feature_tiles) * Shape<kBM>::kFeatures;
  r.small = tile >= num_big;
  r.e = r.small ? w.small_expert[tile - num_big] : w.a.tile_expert[tile];
  r.row0 = r.small ? w.small_row0[tile - num_big] : w.a.tile_row0[tile];
  return r;
}

struct Barriers {
  uint64_t* full;         // [kStages]: a stage's copies landed
  uint64_t* empty;        // [kStages]: every consumer warp left the stage
  uint64_t* scale_full;   // [2]: a unit's scales landed
  uint64_t* scale_empty;  // [2]: every consumer warp is past a unit's main loop
};

// The producer warp: per unit, the scales (all lanes, cp.async) into buffer
// `local & 1`, then lane 0 the stages (two TMA boxes each) into the ring.
template <int kBM>
__device__ void Produce(const WsArgs& w, const CUtensorMap& act_map, const CUtensorMap& w_map,
                        uint8_t* stages, uint8_t* scales, const Barriers& b, int units,
                        int num_big) {
  constexpr int kS = Stages<kBM>();
  const GemmArgs& a = w.a;
  const int lane = threadIdx.x & 31, nb = a.k / 32;
  int it = 0;
  int local = 0;
  for (int u = blockIdx.x; u < units; u += gridDim.x, ++local) {
    const Unit t = UnitOf<kBM>(w, u, num_big);
    const int sb = local & 1;
    if (local >= 2) MbarWait(&b.scale_empty[sb], ((local >> 1) - 1) & 1);
    uint8_t* dst = scales + sb * ScaleBufferBytes<kBM>(nb);
    const uint8_t* src = a.scales + (static_cast<size_t>(t.e) * a.n + t.n0) * nb;
    const int bytes =
        min(Shape<kBM>::kFeatures, a.n - t.n0) * nb;  // a multiple of 16 (MoeGemmWsSupports)
    for (int i = lane * 16; i < bytes; i += 32 * 16) CpAsync16(dst + i, src + i, 16);
    MbarArriveOnCpAsync(&b.scale_full[sb]);
    if (lane == 0) {
      const int act_row = a.route.offset[t.e] + t.row0;
      const int w_row = t.e * a.n + t.n0;
      for (int kt = 0; kt < w.k_tiles; ++kt, ++it) {
        const int slot = it % kS;
        if (it >= kS) MbarWait(&b.empty[slot], ((it / kS) - 1) & 1);
        uint8_t* st = stages + slot * StageBytes<kBM>();
        MbarExpectTx(&b.full[slot], StageBytes<kBM>());
        TmaLoad2D(st, &act_map, kt * kBK, act_row, &b.full[slot]);
        TmaLoad2D(st + kBM * kActRowBytes, &w_map, kt * kWeightRowBytes, w_row, &b.full[slot]);
      }
    }
    __syncwarp();
  }
}

// One stage of a consumer warpgroup's main loop into accumulators d, with
// fragment set kSet (the other set may still be read by the previous stage's
// wgmmas, which this stage waits for after issuing its own).
template <int kBM, bool kSmall, int kSet>
__device__ __forceinline__ void ConsumeStage(uint8_t* stages, const uint8_t* s_scales,
                                             const Barriers& b, int kt, int nb, int c0, int c1,
                                             int& it, int& prev_slot,
                                             uint32_t (&af)[2][kBK / 16][4], float (&d)[kBM / 2]) {
  constexpr int kS = Stages<kBM>();
  const int lane = threadIdx.x & 31, t = lane & 3;
  const int f0 = WgmmaFeatureRow();
  const int slot = it % kS;
  MbarWait(&b.full[slot], (it / kS) & 1);
  const uint8_t* st = stages + slot * StageBytes<kBM>();
  const uint8_t* sw = st + kBM * kActRowBytes;
  const int kb = kt * 2 + (t >> 1);
  const uint32_t sc0 = HalfScale(kb < nb ? s_scales[f0 * nb + kb] : 0u, c0);
  const uint32_t sc1 = HalfScale(kb < nb ? s_scales[(f0 + 8) * nb + kb] : 0u, c1);
  const uint2 w0 = *reinterpret_cast<const uint2*>(sw + f0 * kWeightRowBytes + 8 * t);
  const uint2 w1 = *reinterpret_cast<const uint2*>(sw + (f0 + 8) * kWeightRowBytes + 8 * t);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const Fp4Pairs p0 = DecodeWord(half == 0 ? w0.x : w0.y);
    const Fp4Pairs p1 = DecodeWord(half == 0 ? w1.x : w1.y);
#pragma unroll
    for (int k2 = 0; k2 < 2; ++k2) {
      uint32_t(&f)[4] = af[kSet][2 * half + k2];
      f[0] = MulHalf2(p0.p[2 * k2], sc0);
      f[1] = MulHalf2(p1.p[2 * k2], sc1);
      f[2] = MulHalf2(p0.p[2 * k2 + 1], sc0);
      f[3] = MulHalf2(p1.p[2 * k2 + 1], sc1);
    }
  }
  FenceAccumulators(d);
  WgmmaFence();
  const uint64_t desc = SmemDescSw128(st);
#pragma unroll
  for (int kk = 0; kk < kBK / 16; ++kk) {
    if constexpr (kSmall) {
      Wgmma<kBM / 2>(reinterpret_cast<float(&)[kBM / 4]>(d), af[kSet][kk], desc + 2 * kk);
    } else {
      Wgmma<kBM>(d, af[kSet][kk], desc + 2 * kk);
    }
  }
  WgmmaCommit();
  // The previous stage's wgmmas are done: its fragments and its shared
  // memory are free.
  asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
  FenceAccumulators(d);
  FenceFragments(af[kSet ^ 1]);
  if (prev_slot >= 0) {
    __syncwarp();
    if (lane == 0) MbarArrive(&b.empty[prev_slot]);
  }
  prev_slot = slot;
  ++it;
}

// A unit's reduction, two stages per round so each uses its own fragment set.
template <int kBM, bool kSmall>
__device__ __forceinline__ void MainLoop(uint8_t* stages, const uint8_t* s_scales,
                                         const Barriers& b, int k_tiles, int nb, int c0, int c1,
                                         int& it, int& prev_slot, uint32_t (&af)[2][kBK / 16][4],
                                         float (&d)[kBM / 2]) {
  int kt = 0;
  for (; kt + 1 < k_tiles; kt += 2) {
    ConsumeStage<kBM, kSmall, 0>(stages, s_scales, b, kt, nb, c0, c1, it, prev_slot, af, d);
    ConsumeStage<kBM, kSmall, 1>(stages, s_scales, b, kt + 1, nb, c0, c1, it, prev_slot, af, d);
  }
  if (kt < k_tiles) {
    ConsumeStage<kBM, kSmall, 0>(stages, s_scales, b, kt, nb, c0, c1, it, prev_slot, af, d);
  }
  WgmmaWaitAll();
}

// A consumer warpgroup: features 64 (warp / 4) .. + 63 of each unit.
template <bool kDown, int kBM>
__device__ void Consume(const WsArgs& w, uint8_t* stages, const uint8_t* scales, const Barriers& b,
                        int units, int num_big) {
  const GemmArgs& a = w.a;
  const int lane = threadIdx.x & 31, nb = a.k / 32;
  const int f0 = WgmmaFeatureRow();
  int it = 0;
  int local = 0;
  for (int u = blockIdx.x; u < units; u += gridDim.x, ++local) {
    const Unit t = UnitOf<kBM>(w, u, num_big);
    const int sb = local & 1;
    MbarWait(&b.scale_full[sb], (local >> 1) & 1);
    const uint8_t* s_scales = scales + sb * ScaleBufferBytes<kBM>(nb);
    const int c0 = RowShift(s_scales + f0 * nb, nb), c1 = RowShift(s_scales + (f0 + 8) * nb, nb);
    float d[kBM / 2];
#pragma unroll
    for (int i = 0; i < kBM / 2; ++i) d[i] = 0.f;
    uint32_t af[2][kBK / 16][4];
    int prev_slot = -1;
    if (t.small) {
      MainLoop<kBM, true>(stages, s_scales, b, w.k_tiles, nb, c0, c1, it, prev_slot, af, d);
    } else {
      MainLoop<kBM, false>(stages, s_scales, b, w.k_tiles, nb, c0, c1, it, prev_slot, af, d);
    }
    WgmmaWaitAll();
    FenceAccumulators(d);
    FenceFragments(af[0]);
    FenceFragments(af[1]);
    __syncwarp();
    if (lane == 0) {
      MbarArrive(&b.empty[prev_slot]);
      MbarArrive(&b.scale_empty[sb]);
    }
    const int rows = min(t.small ? kBM / 2 : kBM, a.route.count[t.e] - t.row0);
    WgmmaEpilogue<kDown, kBM>(a, d, t.e, t.n0, rows, a.route.offset[t.e] + t.row0, c0, c1);
  }
}

template <bool kDown, int kBM>
__global__ void __launch_bounds__(Shape<kBM>::kThreads, 1)
    MoeGemmWsKernel(const __grid_constant__ CUtensorMap act_map,
                    const __grid_constant__ CUtensorMap w_map, WsArgs w) {
  constexpr int kS = Stages<kBM>();
  using S = Shape<kBM>;
  extern __shared__ __align__(16) uint8_t smem[];
  uint8_t* stages = smem;
  const uint32_t off = ptx::SharedAddress(stages) & 1023u;  // the swizzle's period
  if (off != 0) stages += 1024 - off;
  const int nb = w.a.k / 32;
  uint8_t* scales = stages + kS * StageBytes<kBM>();
  auto* bars = reinterpret_cast<uint64_t*>(scales + 2 * ScaleBufferBytes<kBM>(nb));
  const Barriers b{bars, bars + kS, bars + 2 * kS, bars + 2 * kS + 2};
  if (threadIdx.x == 0) {
    for (int i = 0; i < kS; ++i) {
      MbarInit(&b.full[i], 1);
      MbarInit(&b.empty[i], S::kConsumerWarps);
    }
    for (int i = 0; i < 2; ++i) {
      MbarInit(&b.scale_full[i], 32);
      MbarInit(&b.scale_empty[i], S::kConsumerWarps);
    }
  }
  __syncthreads();
  const int num_big = *w.a.num_tiles;
  const int units = (num_big + *w.num_small) * w.feature_tiles;
  if (threadIdx.x >= 32 * S::kConsumerWarps) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(S::kProducerRegisters));
    if (threadIdx.x < 32 * S::kConsumerWarps + 32) {
      Produce<kBM>(w, act_map, w_map, stages, scales, b, units, num_big);
    }
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(S::kConsumerRegisters));
    Consume<kDown, kBM>(w, stages, scales, b, units, num_big);
  }
}

// dst[i, :] = the permuted f16 row of x[pair_of[i] / top_k] (PermuteRowsKernel's order).
__global__ void GatherRowsKernel(const uint16_t* x, const int32_t* pair_of,
                                 const int32_t* num_valid, int top_k, int k, int kp,
                                 uint16_t* dst) {
  const int rows = *num_valid;
  const size_t n = static_cast<size_t>(rows) * kp;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    const int r = static_cast<int>(i / kp), l = static_cast<int>(i % kp);
    const int p = (l & ~63) + PhysicalOf(l & 63);
    const size_t src = static_cast<size_t>(pair_of[r] / top_k) * k + p;
    dst[i] = p < k ? __half_as_ushort(__float2half_rn(Bf16ToFloat(x[src]))) : uint16_t{0};
  }
}

PFN_cuTensorMapEncodeTiled_v12000 EncodeTiled() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault,
                                         &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      p = nullptr;
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

// A 2D row-major map of `rows` rows of `row_bytes` bytes (elements of
// `elem` bytes), boxes of box_cols elements x box_rows rows.
cudaError_t Map2D(CUtensorMap* map, const void* base, CUtensorMapDataType type, int elem,
                  uint64_t cols, uint64_t rows, uint32_t box_cols, uint32_t box_rows,
                  CUtensorMapSwizzle swizzle) {
  const auto encode = EncodeTiled();
  if (encode == nullptr) return cudaErrorNotSupported;
  const cuuint64_t dims[2] = {cols, rows};
  const cuuint64_t strides[1] = {cols * elem};
  const cuuint32_t box[2] = {box_cols, box_rows};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult r = encode(map, type, 2, const_cast<void*>(base), dims, strides, box,
                            element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

template <bool kDown, int kBM>
cudaError_t Launch(const WsArgs& w, int num_experts, const uint16_t* act, int act_rows,
                   int max_units, cudaStream_t stream) {
  CUtensorMap act_map{}, w_map{};
  cudaError_t err =
      Map2D(&act_map, act, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2, static_cast<uint64_t>(w.a.kp),
            static_cast<uint64_t>(act_rows), kBK, kBM, CU_TENSOR_MAP_SWIZZLE_128B);
  if (err != cudaSuccess) return err;
  const int nb = w.a.k / 32;
  err = Map2D(&w_map, w.a.blocks, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, static_cast<uint64_t>(nb) * 16,
              static_cast<uint64_t>(num_experts) * static_cast<uint64_t>(w.a.n), kWeightRowBytes,
              Shape<kBM>::kFeatures, CU_TENSOR_MAP_SWIZZLE_NONE);
  if (err != cudaSuccess) return err;
  auto kernel = MoeGemmWsKernel<kDown, kBM>;
  const size_t smem = SharedBytes<kBM>(nb);
  static PerDevice<size_t> allowed;
  err = AllowSharedBytes(kernel, smem, &allowed);
  if (err != cudaSuccess) return err;
  static PerDevice<int> sms;
  std::atomic<int>* slot = sms.Current();
  int num_sms = slot != nullptr ? slot->load(std::memory_order_relaxed) : 0;
  if (num_sms == 0) {
    int device = 0;
    err = cudaGetDevice(&device);
    if (err == cudaSuccess) {
      err = cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device);
    }
    if (err != cudaSuccess) return err;
    if (slot != nullptr) slot->store(num_sms, std::memory_order_relaxed);
  }
  const int grid = std::max(1, std::min(num_sms, max_units));
  kernel<<<grid, Shape<kBM>::kThreads, smem, stream>>>(act_map, w_map, w);
  return cudaGetLastError();
}

}  // namespace

bool MoeGemmWsSupports(const MoeDeviceWeights& w) {
  const auto aligned = [](int n, int k) {
    const size_t nb = static_cast<size_t>(k) / 32;
    return (static_cast<size_t>(n) * nb) % 16 == 0 && (Shape<64>::kFeatures * nb) % 16 == 0 &&
           (Shape<128>::kFeatures * nb) % 16 == 0;
  };
  return EncodeTiled() != nullptr && aligned(2 * w.intermediate, w.hidden) &&
         aligned(w.hidden, w.intermediate);
}

size_t MoeGemmWsGatherBytes(const MoeDeviceWeights& w, int pairs) {
  return AlignUp(static_cast<size_t>(pairs) * Padded64(w.hidden) * sizeof(uint16_t), 256);
}

cudaError_t LaunchMoeGemmWs(bool down, const GemmArgs& args, int num_experts, int rows_per_tile,
                            const int32_t* small_expert, const int32_t* small_row0,
                            const int32_t* num_small, int max_tiles, const uint16_t* act,
                            int act_rows, cudaStream_t stream) {
  const int features = rows_per_tile == 128 ? Shape<128>::kFeatures : Shape<64>::kFeatures;
  WsArgs w{args,
           small_expert,
           small_row0,
           num_small,
           (args.n + features - 1) / features,
           (args.k + kBK - 1) / kBK};
  const int max_units = max_tiles * w.feature_tiles;
  switch (rows_per_tile) {
    case 128:
      return down ? Launch<true, 128>(w, num_experts, act, act_rows, max_units, stream)
                  : Launch<false, 128>(w, num_experts, act, act_rows, max_units, stream);
    case 64:
      return down ? Launch<true, 64>(w, num_experts, act, act_rows, max_units, stream)
                  : Launch<false, 64>(w, num_experts, act, act_rows, max_units, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

cudaError_t LaunchGatherRows(const uint16_t* x, const int32_t* pair_of, const int32_t* num_valid,
                             int pairs, int top_k, int k, int kp, uint16_t* dst,
                             cudaStream_t stream) {
  const size_t n = static_cast<size_t>(pairs) * kp;
  GatherRowsKernel<<<static_cast<unsigned>(std::min<size_t>((n + 255) / 256, 4096)), 256, 0,
                     stream>>>(x, pair_of, num_valid, top_k, k, kp, dst);
  return cudaGetLastError();
}

}  // namespace flotilla::kernels::cuda
