// The MXFP4 grouped GEMMs fed by tensor-map copies; see moe_gemm_tma.h.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
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
using ptx::MbarExpectTx;
using ptx::MbarInit;
using ptx::MbarWait;
using ptx::TmaLoad2D;

constexpr int kThreads = 256;          // two warpgroups, 64 features each
constexpr int kBN = 128;               // output features per tile
constexpr int kBK = 64;                // reduction per stage: two MXFP4 blocks
constexpr int kActRowBytes = kBK * 2;  // f16, 128-byte swizzled by the copy
// Two blocks per weight row per stage, dense: a warp's 8-byte fragment reads
// of rows g (0-7) fall in two wavefronts, which 256 bytes take anyway.
constexpr int kWeightRowBytes = kBK / 2;
// Four stages, consumed two at a time: one CTA barrier per 128 values of the
// reduction, the copies one pair ahead (H200, 120b layer, against one stage
// per barrier with three ahead: 1,024 tokens 866 / 904-915 us, 2,048
// 1,206-1,212 / 1,210-1,228, 4,096 within the runs' spread).
constexpr int kStages = 4;

template <int kBM>
__host__ __device__ constexpr int StageBytes() {
  return kBM * kActRowBytes + kBN * kWeightRowBytes;
}
static_assert(StageBytes<32>() % 1024 == 0 && StageBytes<80>() % 1024 == 0 &&
                  StageBytes<160>() % 1024 == 0,
              "stages keep the activation tiles on 1024 bytes");

__host__ __device__ constexpr int ScaleBytes(int nb) {
  return static_cast<int>(AlignUp(static_cast<size_t>(kBN) * nb, 16));
}
template <int kBM>
size_t SharedBytes(int nb) {
  return 1024 /* alignment slack */ + static_cast<size_t>(kStages) * StageBytes<kBM>() +
         ScaleBytes(nb) + kStages * sizeof(uint64_t);
}

// One (row tile, 128 features) tile of one projection: the activation and
// weight stages arrive by tensor-map copies that thread 0 issues a pair of
// stages ahead, completing on one mbarrier per stage; the scales by cp.async. The
// decode, wgmma and epilogue are the CTA-per-tile wgmma kernel's.
//
// Two launches of one projection (the big tiles, then the remainders) may
// overlap: each launch lets the next one start once all its CTAs are
// running (the next one's inputs were complete before this one started), so
// the remainders fill the SMs the big tiles' last wave leaves idle. A launch
// that overlaps the one before it (`overlapping`, launched programmatically
// dependent) waits for that one at its end, so that its own completion, on
// which the stream's next work waits, still means both are done.
//
// 80-row tiles are held to 80 registers so that three CTAs share an SM (at
// 85, two do; ptxas then serializes their wgmmas, C7512, and still the three
// are faster: 2,048 tokens 1,155 against 1,250 us per layer). Tiles of up to
// 64 rows run the loop over whole turns of the stage ring (slots, wgmma
// descriptors and mbarrier parity fixed at compile time): 1,024 tokens 835
// against 868 us. So do the 128- and 160-row tiles since their stages fence
// only the accumulators they write (107 and 122 registers; before, the
// 128-row gate_up tile took 138 so): H200 prefill 4,096 tokens 98.7-100.2
// against 100.1-101.0 ms, 8,192 200.9-202.1 against 202.3-203.5.
// 160-row tiles (an expert of 129-160 rows in one pass over its weights, not
// a 128-row tile and a remainder that decodes them again) are held to 128
// registers so that two CTAs share an SM, as the 128-row ones do; at that
// tiling the experts that 160-row tiles would not cover in fewer passes take
// 128-row tiles in the same launch (ExpertTileRows), whose stages copy only
// 128 activation rows.
template <int kBM>
constexpr int kMinBlocksPerSm = kBM == 80    ? 3
                                : kBM == 160 ? 2
                                             : 1;
template <bool kDown, int kBM, bool kRing = (kBM <= 64 || kBM >= 128)>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm<kBM>)
    MoeGemmTmaKernel(const __grid_constant__ CUtensorMap act_map,
                     const __grid_constant__ CUtensorMap act_map_128,
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
  uint8_t* stages = smem;
  const uint32_t off = ptx::SharedAddress(stages) & 1023u;  // the swizzle's period
  if (off != 0) stages += 1024 - off;
  const int nb = a.k / 32;
  uint8_t* s_scales = stages + kStages * StageBytes<kBM>();
  auto* full = reinterpret_cast<uint64_t*>(s_scales + ScaleBytes(nb));
  const int e = a.tile_expert[tile];
  const int row0 = a.tile_row0[tile];
  const int count = a.route.count[e];
  const int rows = min(ExpertTileRows(count, kBM), count - row0);
  // A 160-row tile's stages take only the first 128 activation rows when it
  // holds no more (act_map_128: boxes of 128 rows), the rest of the slot unused.
  const bool short_box = kBM == 160 && rows <= 128;
  const uint32_t stage_bytes =
      short_box ? 128 * kActRowBytes + kBN * kWeightRowBytes : StageBytes<kBM>();
  const int sorted0 = a.route.offset[e] + row0;
  const int n0 = blockIdx.x * kBN;
  const int valid_n = min(kBN, a.n - n0);
  const int k_tiles = (a.k + kBK - 1) / kBK;
  const int tid = threadIdx.x;
  const int w_row = e * a.n + n0;
  auto load = [&](int kt) {
    uint8_t* st = stages + (kt % kStages) * StageBytes<kBM>();
    uint64_t* bar = &full[kt % kStages];
    MbarExpectTx(bar, stage_bytes);
    TmaLoad2D(st, short_box ? &act_map_128 : &act_map, kt * kBK, sorted0, bar);
    TmaLoad2D(st + kBM * kActRowBytes, &w_map, kt * kWeightRowBytes, w_row, bar);
  };
  static_assert(kStages == 4, "two pairs of stages: one in use, one in flight");
  if (tid == 0) {
    for (int i = 0; i < kStages; ++i) MbarInit(&full[i], 1);
    for (int kt = 0; kt < 2 && kt < k_tiles; ++kt) load(kt);
  }
  // The tile's scales: [kBN rows][nb]; rows past the end are never used.
  const uint8_t* scale_src = a.scales + (static_cast<size_t>(e) * a.n + n0) * nb;
  for (int i = tid * 16; i < valid_n * nb; i += kThreads * 16)
    CpAsync16(s_scales + i, scale_src + i, 16);
  CpAsyncCommit();
  CpAsyncWait<0>();
  __syncthreads();  // the scales and the barriers' init

  const int f0 = WgmmaFeatureRow();
  const int c0 = RowShift(s_scales + f0 * nb, nb), c1 = RowShift(s_scales + (f0 + 8) * nb, nb);
  float d[kBM / 2];
#pragma unroll
  for (int i = 0; i < kBM / 2; ++i) d[i] = 0.f;
  // The main loop with wgmmas kN rows wide: only the rows the tile holds go
  // through the tensor cores (a 128-row tile holding 65-96 of an expert's
  // rows costs them three quarters of a full one).
  auto main_loop = [&](auto width) {
    constexpr int kN = decltype(width)::value;
    auto stage = [&](int kt) {
      const uint8_t* st = stages + (kt % kStages) * StageBytes<kBM>();
      WgmmaStage<kBM, kWeightRowBytes, kN>(st, st + kBM * kActRowBytes, s_scales, nb, kt, c0, c1,
                                           nullptr, d);
    };
    // Waits for stage kt in `slot` (and kt + 1 in the next slot with
    // `second`; a pair starts on an even stage, so both share the ring's
    // turn and parity); once every warpgroup is past the previous pair's
    // wgmmas, that pair's slots take the next pair.
    auto slots_wait = [&](int slot, uint32_t parity, int kt, bool second) {
      MbarWait(&full[slot], parity);
      if (second) MbarWait(&full[slot + 1], parity);
      __syncthreads();
      if (tid == 0) {
        if (kt + 2 < k_tiles) load(kt + 2);
        if (kt + 3 < k_tiles) load(kt + 3);
      }
    };
    auto pair_wait = [&](int kt, bool second) {
      slots_wait(kt % kStages, (kt / kStages) & 1, kt, second);
    };
    int kt = 0;
    if constexpr (kRing) {
      // Whole turns of the ring (two pairs) with the slots, their wgmma
      // descriptors and the mbarrier parity known at compile time or
      // toggled once per turn.
      const uint64_t desc0 = SmemDescSw128(stages);
      auto stage_in = [&](auto slot, int k) {
        constexpr int kSlot = decltype(slot)::value;
        const uint8_t* st = stages + kSlot * StageBytes<kBM>();
        WgmmaStageDesc<kBM, kWeightRowBytes, kN>(
            desc0 + static_cast<uint64_t>(kSlot * (StageBytes<kBM>() >> 4)),
            st + kBM * kActRowBytes, s_scales, nb, k, c0, c1, nullptr, d);
      };
      uint32_t parity = 0;
      for (; kt + kStages - 1 < k_tiles; kt += kStages, parity ^= 1u) {
        slots_wait(0, parity, kt, true);
        stage_in(std::integral_constant<int, 0>{}, kt);
        stage_in(std::integral_constant<int, 1>{}, kt + 1);
        slots_wait(2, parity, kt + 2, true);
        stage_in(std::integral_constant<int, 2>{}, kt + 2);
        stage_in(std::integral_constant<int, 3>{}, kt + 3);
      }
    }
    // Whole pairs, then an odd last stage (no wgmma under a condition).
    for (; kt + 1 < k_tiles; kt += 2) {
      pair_wait(kt, true);
      stage(kt);
      stage(kt + 1);
    }
    if (kt < k_tiles) {
      pair_wait(kt, false);
      stage(kt);
    }
  };
  const int width = WgmmaWidth<kBM>(rows);
  if (kBM == 80 && width > 64) {
    main_loop(std::integral_constant<int, (kBM == 80 ? 80 : 32)>{});
  } else if (kBM == 160 && width > 128) {
    main_loop(std::integral_constant<int, (kBM == 160 ? 160 : 32)>{});
  } else if (kBM >= 128 && width > 96) {
    main_loop(std::integral_constant<int, (kBM >= 128 ? 128 : 32)>{});
  } else if (kBM >= 128 && width > 64) {
    main_loop(std::integral_constant<int, (kBM >= 128 ? 96 : kBM)>{});
  } else if (kBM >= 64 && width > 32) {
    main_loop(std::integral_constant<int, (kBM >= 64 ? 64 : kBM)>{});
  } else {
    main_loop(std::integral_constant<int, 32>{});
  }
  WgmmaEpilogue<kDown, kBM>(a, d, e, n0, rows, sorted0, c0, c1);
  wait_for_previous();
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

// A 2D row-major map of `rows` rows of `cols` elements of `elem` bytes, in
// boxes of box_cols elements x box_rows rows.
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
cudaError_t Launch(const GemmArgs& a, int num_experts, const uint16_t* act, int act_rows,
                   int max_tiles, cudaStream_t stream, bool overlapping) {
  CUtensorMap act_map{}, act_map_128{}, w_map{};
  cudaError_t err =
      Map2D(&act_map, act, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2, static_cast<uint64_t>(a.kp),
            static_cast<uint64_t>(act_rows), kBK, kBM, CU_TENSOR_MAP_SWIZZLE_128B);
  if (err != cudaSuccess) return err;
  act_map_128 = act_map;
  if (kBM > 128) {
    err = Map2D(&act_map_128, act, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2, static_cast<uint64_t>(a.kp),
                static_cast<uint64_t>(act_rows), kBK, 128, CU_TENSOR_MAP_SWIZZLE_128B);
    if (err != cudaSuccess) return err;
  }
  const int nb = a.k / 32;
  err = Map2D(&w_map, a.blocks, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, static_cast<uint64_t>(nb) * 16,
              static_cast<uint64_t>(num_experts) * static_cast<uint64_t>(a.n), kWeightRowBytes, kBN,
              CU_TENSOR_MAP_SWIZZLE_NONE);
  if (err != cudaSuccess) return err;
  auto kernel = MoeGemmTmaKernel<kDown, kBM>;
  const size_t smem = SharedBytes<kBM>(nb);
  static PerDevice<size_t> allowed;
  err = AllowSharedBytes(kernel, smem, &allowed);
  if (err != cudaSuccess) return err;
  const dim3 grid((a.n + kBN - 1) / kBN, static_cast<unsigned>(max_tiles));
  return LaunchPdl(kernel, grid, dim3(kThreads), smem, stream, overlapping, act_map, act_map_128,
                   w_map, a, overlapping);
}

}  // namespace

bool MoeGemmTmaSupports(const MoeDeviceWeights& w) {
  const auto aligned = [](int n, int k) {
    const size_t nb = static_cast<size_t>(k) / 32;
    return (static_cast<size_t>(n) * nb) % 16 == 0 && (kBN * nb) % 16 == 0;
  };
  const auto on16 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return EncodeTiled() != nullptr && aligned(2 * w.intermediate, w.hidden) &&
         aligned(w.hidden, w.intermediate) && on16(w.gate_up_blocks) && on16(w.down_blocks) &&
         on16(w.gate_up_scales) && on16(w.down_scales);
}

size_t MoeGemmTmaGatherBytes(const MoeDeviceWeights& w, int pairs) {
  return AlignUp(static_cast<size_t>(pairs) * Padded64(w.hidden) * sizeof(uint16_t), 256);
}

cudaError_t LaunchMoeGemmTma(bool down, const GemmArgs& args, int num_experts, int rows,
                             int max_tiles, const uint16_t* act, int act_rows, cudaStream_t stream,
                             bool overlapping) {
  switch (rows) {
    case 160:
      return down ? Launch<true, 160>(args, num_experts, act, act_rows, max_tiles, stream,
                                      overlapping)
                  : Launch<false, 160>(args, num_experts, act, act_rows, max_tiles, stream,
                                       overlapping);
    case 128:
      return down ? Launch<true, 128>(args, num_experts, act, act_rows, max_tiles, stream,
                                      overlapping)
                  : Launch<false, 128>(args, num_experts, act, act_rows, max_tiles, stream,
                                       overlapping);
    case 80:
      return down ? Launch<true, 80>(args, num_experts, act, act_rows, max_tiles, stream,
                                     overlapping)
                  : Launch<false, 80>(args, num_experts, act, act_rows, max_tiles, stream,
                                      overlapping);
    case 64:
      return down ? Launch<true, 64>(args, num_experts, act, act_rows, max_tiles, stream,
                                     overlapping)
                  : Launch<false, 64>(args, num_experts, act, act_rows, max_tiles, stream,
                                      overlapping);
    case 32:
      return down ? Launch<true, 32>(args, num_experts, act, act_rows, max_tiles, stream,
                                     overlapping)
                  : Launch<false, 32>(args, num_experts, act, act_rows, max_tiles, stream,
                                      overlapping);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace flotilla::kernels::cuda
