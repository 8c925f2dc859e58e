// The CUDA MoE layer against the CPU reference ops (LinearMxfp4, SwigluClamped,
// the router-weighted sum) on the same bf16 inputs and the same MXFP4 bytes.
//
// Tolerance: every product fp4 * bf16 is exact in f32 on both sides, so the
// only differences are the order of f32 additions (2880-term dot products,
// per-block partial sums on the GPU, atomics in the scatter-add) and expf. That
// is ~1e-6 relative to the magnitudes summed; we allow 1e-4 * max(1, max|ref|)
// per output element, which still catches a single wrong nibble, scale, bias,
// routing slot or gate/up swap (each moves outputs by 1e-2 or more).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "common/bf16.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/moe.h"
#include "kernels/cuda/moe_gemm.h"
#include "kernels/cuda/moe_w4a8.h"
#include "tests/kernels/cuda_test_util.h"

namespace flotilla::kernels {
namespace {

constexpr float kLimit = 7.0f;
constexpr float kAlpha = 1.702f;

using MoeCudaTest = CudaTest;  // skips without a GPU

// Host copy of the layer's weights, checkpoint layout.
struct HostMoe {
  int E = 0, H = 0, I = 0;
  std::vector<uint8_t> gu_blocks, gu_scales, d_blocks, d_scales;
  std::vector<uint16_t> gu_bias, d_bias;
};

template <typename T>
std::vector<T> ToHost(const T* d, size_t n) {
  std::vector<T> h(n);
  EXPECT_EQ(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return h;
}

HostMoe CopyBack(const cuda::MoeDeviceWeights& w) {
  HostMoe m;
  m.E = w.num_experts, m.H = w.hidden, m.I = w.intermediate;
  size_t e = m.E, h = m.H, i = m.I;
  m.gu_blocks = ToHost(w.gate_up_blocks, e * 2 * i * h / 2);
  m.gu_scales = ToHost(w.gate_up_scales, e * 2 * i * h / 32);
  m.gu_bias = ToHost(w.gate_up_bias, e * 2 * i);
  m.d_blocks = ToHost(w.down_blocks, e * h * i / 2);
  m.d_scales = ToHost(w.down_scales, e * h * i / 32);
  m.d_bias = ToHost(w.down_bias, e * h);
  return m;
}

struct Routing {
  std::vector<int32_t> ids;
  std::vector<float> weights;
};

// K distinct experts per token and softmax weights over random logits.
Routing RandomRouting(int T, int K, int E, std::mt19937& rng) {
  Routing r;
  std::vector<int> perm(E);
  std::normal_distribution<float> logit(0.f, 1.f);
  for (int t = 0; t < T; ++t) {
    std::iota(perm.begin(), perm.end(), 0);
    std::vector<float> l(K);
    float total = 0;
    for (int k = 0; k < K; ++k) {
      std::uniform_int_distribution<int> pick(k, E - 1);
      std::swap(perm[k], perm[pick(rng)]);
      r.ids.push_back(perm[k]);
      l[k] = std::exp(logit(rng));
      total += l[k];
    }
    for (int k = 0; k < K; ++k) r.weights.push_back(l[k] / total);
  }
  return r;
}

// Pairs grouped by expert so each expert's weights are decoded once per call;
// ids outside [0, E) contribute nothing (the CUDA layer counts and skips them).
std::vector<float> CpuReference(const HostMoe& m, int E, const std::vector<uint16_t>& x_bf16,
                                const Routing& r, int T, int K) {
  const size_t H = m.H, I = m.I;
  cpu::ThreadPool pool(static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  std::vector<float> y(T * H, 0.f);
  std::vector<std::vector<int>> pairs_of(E);
  for (int p = 0; p < T * K; ++p) {
    if (r.ids[p] >= 0 && r.ids[p] < E) pairs_of[r.ids[p]].push_back(p);
  }
  for (int e = 0; e < E; ++e) {
    const std::vector<int>& ps = pairs_of[e];
    const size_t n = ps.size();
    if (n == 0) continue;
    std::vector<float> x(n * H), gu(n * 2 * I), act(n * I), down(n * H);
    for (size_t i = 0; i < n; ++i) {
      for (size_t c = 0; c < H; ++c) x[i * H + c] = Bf16ToFloat(x_bf16[(ps[i] / K) * H + c]);
    }
    const size_t ue = e;
    cpu::LinearMxfp4(&pool, x.data(), n, H, m.gu_blocks.data() + ue * 2 * I * H / 2,
                     m.gu_scales.data() + ue * 2 * I * H / 32, 2 * I,
                     m.gu_bias.data() + ue * 2 * I, gu.data());
    cpu::SwigluClamped(gu.data(), n, I, kLimit, kAlpha, act.data());
    cpu::LinearMxfp4(&pool, act.data(), n, I, m.d_blocks.data() + ue * H * I / 2,
                     m.d_scales.data() + ue * H * I / 32, H, m.d_bias.data() + ue * H,
                     down.data());
    for (size_t i = 0; i < n; ++i) {
      const int p = ps[i];
      for (size_t c = 0; c < H; ++c) y[(p / K) * H + c] += r.weights[p] * down[i * H + c];
    }
  }
  return y;
}

// Runs the CUDA layer on `m`-shaped device weights and compares with the CPU.
// `bad_ids` > 0 replaces that many ids with out-of-range ones and makes some
// tokens pick one expert twice (as a buggy router could): both must match the
// reference, which skips the former and counts the latter twice.
// deterministic: the layer runs in that mode twice from the same start, and
// both outputs must be the same bits. `tuning` picks the kernels; `w4a8`
// (the same weights re-laid) runs LaunchMoeW4a8Layer instead.
void CheckLayer(const cuda::MoeDeviceWeights& w, const HostMoe& m, int T, int K, uint32_t seed,
                int bad_ids = 0, bool deterministic = false,
                const cuda::MoeTuning& tuning = cuda::MoeTuning{},
                const cuda::MoeW4a8Weights* w4a8 = nullptr) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, 1.f);
  const size_t H = m.H;
  std::vector<uint16_t> x(T * H);
  for (auto& v : x) v = FloatToBf16(dist(rng));
  const int E = w.num_experts;  // may be a prefix of m's experts
  Routing r = RandomRouting(T, K, E, rng);
  for (int i = 0; i < bad_ids; ++i) {
    std::uniform_int_distribution<int> pick(0, T * K - 1);
    const int p = pick(rng);
    if (i % 2 == 0) {
      r.ids[p] = (i % 4 == 0) ? -1 - i : E + i;
    } else if (K > 1) {
      const int t = p / K;
      r.ids[t * K + 1] = r.ids[t * K];  // one expert twice within a token
    }
  }
  int want_invalid = 0;
  for (int id : r.ids) want_invalid += (id < 0 || id >= E) ? 1 : 0;
  // A nonzero starting output checks that the layer adds into it.
  std::vector<float> out0(T * H);
  for (auto& v : out0) v = dist(rng);

  uint16_t* d_x = nullptr;
  int32_t *d_ids = nullptr, *d_invalid = nullptr;
  float *d_w = nullptr, *d_out = nullptr;
  void* d_ws = nullptr;
  size_t ws = w4a8 != nullptr ? cuda::MoeW4a8WorkspaceBytes(*w4a8, T, K)
                              : cuda::MoeWorkspaceBytes(w, T, K, deterministic);
  ASSERT_EQ(cudaMalloc(&d_x, x.size() * 2), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d_ids, r.ids.size() * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d_w, r.weights.size() * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d_out, out0.size() * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d_invalid, 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d_ws, ws), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d_x, x.data(), x.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d_ids, r.ids.data(), r.ids.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d_w, r.weights.data(), r.weights.size() * 4, cudaMemcpyHostToDevice),
            cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d_out, out0.data(), out0.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  if (w4a8 != nullptr) {
    ASSERT_EQ(cuda::LaunchMoeW4a8Layer(*w4a8, d_x, d_ids, d_w, T, K, kLimit, kAlpha, d_out, d_ws,
                                       ws, d_invalid, nullptr),
              cudaSuccess);
  } else {
    ASSERT_EQ(cuda::LaunchMoeLayer(w, d_x, d_ids, d_w, T, K, kLimit, kAlpha, d_out, d_ws, ws,
                                   d_invalid, nullptr, deterministic, tuning),
              cudaSuccess);
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<float> got = ToHost(d_out, out0.size());
  if (deterministic) {
    ASSERT_EQ(cudaMemcpy(d_out, out0.data(), out0.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cuda::LaunchMoeLayer(w, d_x, d_ids, d_w, T, K, kLimit, kAlpha, d_out, d_ws, ws,
                                   d_invalid, nullptr, deterministic, tuning),
              cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_TRUE(ToHost(d_out, out0.size()) == got) << "T=" << T << ": two runs differ";
  }
  EXPECT_EQ(ToHost(d_invalid, 1)[0], want_invalid);
  cudaFree(d_x), cudaFree(d_ids), cudaFree(d_w), cudaFree(d_out), cudaFree(d_invalid),
      cudaFree(d_ws);

  std::vector<float> want = CpuReference(m, E, x, r, T, K);
  float max_ref = 0, max_err = 0, mean_abs = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    max_ref = std::max(max_ref, std::fabs(want[i]));
    mean_abs += std::fabs(want[i]) / want.size();
  }
  // The grouped-GEMM path rounds h to bf16 (2^-9 relative) before the down
  // projection: its 2880-term sums then differ by ~1e-3 of their spread, so it
  // gets 4e-3 (a wrong nibble, scale, bias or slot still moves outputs by 1e-2).
  // The FP8 path (w4a8) carries h in three e4m3 parts (~12 bits) and sums
  // each block on the FP8 tensor cores, whose accumulation keeps fewer bits
  // than f32: up to 1.1e-4 of the largest output measured (H200), so 5e-4.
  const float rel = w4a8 != nullptr ? 5e-4f : cuda::MoeUsesGemm(T, K, E, tuning) ? 4e-3f : 1e-4f;
  const float tol = rel * std::max(1.f, max_ref);
  int bad = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    float err = std::fabs(got[i] - out0[i] - want[i]);
    max_err = std::max(max_err, err);
    if (!(err <= tol) && ++bad <= 5) {
      ADD_FAILURE() << "token " << i / H << " feature " << i % H << ": cuda " << got[i] - out0[i]
                    << " cpu " << want[i];
    }
  }
  EXPECT_EQ(bad, 0);
  EXPECT_GT(mean_abs, 1e-2f) << "outputs too small for the comparison to mean anything";
  std::printf(
      "%s T=%d K=%d E=%d H=%zu I=%d: max|ref| %.4g mean|ref| %.4g max err %.3g (tol %.3g)\n",
      w4a8 != nullptr                      ? "w4a8"
      : cuda::MoeUsesGemm(T, K, E, tuning) ? "gemm"
                                           : "decode",
      T, K, E, H, m.I, max_ref, mean_abs, max_err, tol);
}

class MoeCudaRealShapeTest : public MoeCudaTest {
 protected:
  static void SetUpTestSuite() {
    if (cuda::DeviceCount() == 0) return;
    ASSERT_EQ(cuda::AllocMoeWeights(128, 2880, 2880, &weights_), cudaSuccess);
    ASSERT_EQ(cuda::LaunchFillMoeWeightsSynthetic(weights_, 42, nullptr), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    host_ = new HostMoe(CopyBack(weights_));
  }
  static void TearDownTestSuite() {
    cuda::FreeMoeWeights(&weights_);
    delete host_;
    host_ = nullptr;
  }
  static cuda::MoeDeviceWeights weights_;
  static HostMoe* host_;
};
cuda::MoeDeviceWeights MoeCudaRealShapeTest::weights_;
HostMoe* MoeCudaRealShapeTest::host_ = nullptr;

TEST_F(MoeCudaRealShapeTest, OneToken) { CheckLayer(weights_, *host_, 1, 4, 1); }
TEST_F(MoeCudaRealShapeTest, ThreeTokens) { CheckLayer(weights_, *host_, 3, 4, 8); }
TEST_F(MoeCudaRealShapeTest, EightTokens) { CheckLayer(weights_, *host_, 8, 4, 2); }
TEST_F(MoeCudaRealShapeTest, SixtyFourTokens) { CheckLayer(weights_, *host_, 64, 4, 3); }
TEST_F(MoeCudaRealShapeTest, ThreeHundredTokens) { CheckLayer(weights_, *host_, 300, 4, 9); }
TEST_F(MoeCudaRealShapeTest, InvalidAndDuplicateIds) {
  CheckLayer(weights_, *host_, 8, 4, 10, /*bad_ids=*/6);
  CheckLayer(weights_, *host_, 64, 4, 11, /*bad_ids=*/20);
}
// Many tokens on few experts: the multi-group (prefill) tensor-core path.
TEST_F(MoeCudaRealShapeTest, ManyTokensPerExpert) {
  cuda::MoeDeviceWeights few = weights_;
  few.num_experts = 4;  // the first 4 experts of the same tensors
  cuda::MoeTuning t;
  t.gemm_min_pairs_per_expert = -1;  // the decode kernels, not the GEMMs
  CheckLayer(few, *host_, 40, 2, 12, /*bad_ids=*/0, /*deterministic=*/false,
             t);  // 80 pairs >= 16 * E: four column groups per decode
}
// The grouped-GEMM path at every size, both tile heights, with bad ids; and
// the decode kernels at the sizes the GEMM path takes by default.
TEST_F(MoeCudaRealShapeTest, GemmPathAtEverySize) {
  for (int rows : {32, 64, 128}) {
    cuda::MoeTuning t;
    t.gemm_min_pairs_per_expert = 0, t.gemm_rows_per_tile = rows;
    CheckLayer(weights_, *host_, 1, 4, 21, /*bad_ids=*/0, /*deterministic=*/false, t);
    CheckLayer(weights_, *host_, 8, 4, 22, /*bad_ids=*/6, /*deterministic=*/false, t);
    CheckLayer(weights_, *host_, 64, 4, 23, /*bad_ids=*/0, /*deterministic=*/false, t);
    CheckLayer(weights_, *host_, 300, 4, 24, /*bad_ids=*/20, /*deterministic=*/false, t);
    cuda::MoeDeviceWeights few = weights_;
    few.num_experts = 4;
    CheckLayer(few, *host_, 200, 2, 25, /*bad_ids=*/0, /*deterministic=*/false,
               t);  // 100 rows per expert: several tiles of 32
  }
  // Every tile at full height (no remainder tiles); tiles of every height on
  // mma.sync instead of wgmma.
  cuda::MoeTuning t;
  t.gemm_min_pairs_per_expert = 0, t.gemm_rows_per_tile = 128, t.gemm_remainder_tiles = false;
  CheckLayer(weights_, *host_, 300, 4, 27, /*bad_ids=*/20, /*deterministic=*/false, t);
  t.gemm_wgmma = false;
  for (int rows : {32, 64, 128}) {
    t.gemm_rows_per_tile = rows;
    CheckLayer(weights_, *host_, 300, 4, 28, /*bad_ids=*/20, /*deterministic=*/false, t);
  }
  // Steps without h's low parts take the tensor-map-fed kernels by default;
  // here the cp.async ones at every height, then the TMA ones with 32-row
  // tiles and 32-row remainders, many tiles per expert included.
  t = cuda::MoeTuning{};
  t.gemm_min_pairs_per_expert = 0, t.gemm_tma = false, t.gemm_h_low_part_below_pairs = 0;
  for (int rows : {32, 64, 128}) {
    t.gemm_rows_per_tile = rows;
    CheckLayer(weights_, *host_, 300, 4, 29, /*bad_ids=*/20, /*deterministic=*/false, t);
  }
  t.gemm_tma = true;
  cuda::MoeDeviceWeights few = weights_;
  few.num_experts = 4;
  for (int rows : {32, 64}) {
    t.gemm_rows_per_tile = rows;
    CheckLayer(weights_, *host_, 300, 4, 30, /*bad_ids=*/20, /*deterministic=*/false, t);
  }
  CheckLayer(few, *host_, 500, 2, 31, /*bad_ids=*/0, /*deterministic=*/false, t);
  // 128-row tiles and 80-row remainders (~150 rows per expert of 4: one of
  // each), their two chains on two streams and on one, plain and per pair.
  t.gemm_rows_per_tile = 128;
  for (const bool two_streams : {true, false}) {
    t.gemm_two_streams = two_streams;
    CheckLayer(few, *host_, 300, 2, 32, /*bad_ids=*/4, /*deterministic=*/false, t);
    CheckLayer(few, *host_, 300, 2, 33, /*bad_ids=*/0, /*deterministic=*/true, t);
  }
  // 160-row tiles: ~150 rows per expert in one tile 160 wide, ~170 as one
  // and an 80-row remainder, ~250 as one and a second 96 wide; and the
  // size from which the default picks them.
  t.gemm_rows_per_tile = 160;
  CheckLayer(few, *host_, 300, 2, 34, /*bad_ids=*/4, /*deterministic=*/false, t);
  CheckLayer(few, *host_, 340, 2, 35, /*bad_ids=*/0, /*deterministic=*/true, t);
  CheckLayer(few, *host_, 500, 2, 36, /*bad_ids=*/0, /*deterministic=*/false, t);
  t = cuda::MoeTuning{};  // 120 rows per expert: 160-row tiling by default
  ASSERT_TRUE(cuda::MoeGemmPrefers160Rows(240 * 2, few.num_experts));
  CheckLayer(few, *host_, 240, 2, 37, /*bad_ids=*/0, /*deterministic=*/false, t);
  t = cuda::MoeTuning{};
  t.gemm_min_pairs_per_expert = -1;
  CheckLayer(weights_, *host_, 300, 4, 26, /*bad_ids=*/0, /*deterministic=*/false, t);
}
// Host planning only (runs without a GPU): the grouped GEMMs take 160-row
// tiles where they save passes over the experts' weights (an expert of
// 129-160 rows in one tile), i.e. around 128 and 256 rows per expert, and
// keep 128-row ones where nearly every expert fits those as well (H200 120b
// layer, us 160 / 128 rows: 3,072 tokens 1,732 / 1,685, 4,096 2,030 /
// 2,256, 6,144 3,151 / 3,054, 8,192 3,796 / 3,967).
TEST(MoeGemmTiling, TallTilesWhereTheySavePasses) {
  EXPECT_LT(cuda::MoeGemmPassesSavedBy160Rows(64.0), 1e-6);
  EXPECT_NEAR(cuda::MoeGemmPassesSavedBy160Rows(128.0), 0.47, 0.02);
  EXPECT_EQ(cuda::MoeGemmPassesSavedBy160Rows(0.0), 0.0);
  const int E = 128, K = 4;
  for (const int tokens : {1, 64, 1024, 2048, 3072, 3584, 6144, 7168}) {
    EXPECT_FALSE(cuda::MoeGemmPrefers160Rows(int64_t{tokens} * K, E)) << tokens;
  }
  for (const int tokens : {4096, 4608, 5120, 8192, 16384}) {
    EXPECT_TRUE(cuda::MoeGemmPrefers160Rows(int64_t{tokens} * K, E)) << tokens;
  }
  EXPECT_FALSE(cuda::MoeGemmPrefers160Rows(0, E));
  EXPECT_FALSE(cuda::MoeGemmPrefers160Rows(100, 0));
}

// The expert slices a rank holds in the tensor-parallel MoE layout (whole
// MXFP4 blocks of the intermediate dimension, 45 and 23 of 90: h's rows are
// padded past them and the last stage of down's reduction runs past the
// weights' rows) through the GEMMs, fed by tensor-map copies and by cp.async.
TEST_F(MoeCudaTest, GemmPathOnTensorParallelSlices) {
  for (int intermediate : {1440, 736}) {
    cuda::MoeDeviceWeights w;
    ASSERT_EQ(cuda::AllocMoeWeights(8, 2880, intermediate, &w), cudaSuccess);
    ASSERT_EQ(cuda::LaunchFillMoeWeightsSynthetic(w, 50 + intermediate, nullptr), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const HostMoe host = CopyBack(w);
    for (const bool tma : {true, false}) {
      for (int rows : {32, 64, 128}) {
        cuda::MoeTuning t;
        t.gemm_min_pairs_per_expert = 0, t.gemm_rows_per_tile = rows, t.gemm_tma = tma;
        t.gemm_h_low_part_below_pairs = 0;
        CheckLayer(w, host, 300, 4, 40 + rows, /*bad_ids=*/5, /*deterministic=*/false, t);
      }
    }
    cuda::FreeMoeWeights(&w);
  }
}

// Deterministic sums: the decode kernels (1-64 tokens, every column-group
// count, a split of 3 capped at 2) and the grouped GEMMs give the same bits
// on every run, and still the reference's values.
TEST_F(MoeCudaRealShapeTest, DeterministicSumsRepeatBitForBit) {
  for (int T : {1, 8, 64}) CheckLayer(weights_, *host_, T, 4, 60 + T, 0, /*deterministic=*/true);
  CheckLayer(weights_, *host_, 64, 4, 61, /*bad_ids=*/20, /*deterministic=*/true);
  cuda::MoeTuning t;
  t.down_split_k = 3;
  CheckLayer(weights_, *host_, 8, 4, 62, /*bad_ids=*/0, /*deterministic=*/true, t);
  cuda::MoeDeviceWeights few = weights_;
  few.num_experts = 4;
  t = cuda::MoeTuning{};
  t.gemm_min_pairs_per_expert = -1;
  for (int groups : {2, 4}) {
    t.decode_groups = groups;
    CheckLayer(few, *host_, 40, 2, 62 + groups, /*bad_ids=*/0, /*deterministic=*/true, t);
  }
  for (int rows : {32, 64, 128}) {
    t = cuda::MoeTuning{};
    t.gemm_min_pairs_per_expert = 0, t.gemm_rows_per_tile = rows;
    CheckLayer(weights_, *host_, 300, 4, 70 + rows, /*bad_ids=*/20, /*deterministic=*/true, t);
  }
}

// The other paths stay selectable and correct: the CUDA-core baseline, the
// two projections as two launches, the shift-and-mask decode with whole-row
// down CTAs and no programmatic dependencies, persistent CTAs with two and
// three tile buffers.
TEST_F(MoeCudaRealShapeTest, OtherVariants) {
  cuda::MoeTuning t;
  t.legacy_fma = true;
  CheckLayer(weights_, *host_, 8, 4, 13, /*bad_ids=*/4, /*deterministic=*/false, t);
  t = cuda::MoeTuning{};
  t.fuse_projections_max_tokens = 0;
  CheckLayer(weights_, *host_, 1, 4, 32, /*bad_ids=*/0, /*deterministic=*/false, t);
  t.fuse_projections_max_tokens = 1 << 30;
  CheckLayer(weights_, *host_, 64, 4, 33, /*bad_ids=*/8, /*deterministic=*/false, t);
  t = cuda::MoeTuning{};
  t.prmt_decode = false, t.evict_first = false, t.pdl = false, t.down_split_k = 1;
  CheckLayer(weights_, *host_, 8, 4, 14, /*bad_ids=*/4, /*deterministic=*/false, t);
  for (int bufs : {2, 3}) {
    t = cuda::MoeTuning{};
    t.tile_buffers = bufs, t.down_split_k = 3;
    CheckLayer(weights_, *host_, 3, 4, 15 + bufs, /*bad_ids=*/2, /*deterministic=*/false, t);
    CheckLayer(weights_, *host_, 64, 4, 16 + bufs, /*bad_ids=*/0, /*deterministic=*/false, t);
  }
}

// The FP8 decode path (moe_w4a8.h) on the same weights re-laid: 1-4 tokens,
// invalid and repeated ids; more tokens are refused.
TEST_F(MoeCudaRealShapeTest, W4a8MatchesTheCpuReference) {
  cuda::MoeW4a8Weights r;
  ASSERT_EQ(cuda::RelayMoeW4a8(weights_, &r, nullptr), cudaSuccess);
  EXPECT_EQ(r.flushed_blocks, 0);  // synthetic scales span 2^-10 .. 2^-5
  for (int T = 1; T <= cuda::kMoeW4a8MaxTokens; ++T) {
    CheckLayer(weights_, *host_, T, 4, 40 + T, /*bad_ids=*/0, /*deterministic=*/false, {}, &r);
  }
  CheckLayer(weights_, *host_, 4, 4, 46, /*bad_ids=*/4, /*deterministic=*/false, {}, &r);
  float* out = nullptr;
  ASSERT_EQ(cudaMalloc(&out, 4), cudaSuccess);
  for (int T : {0, cuda::kMoeW4a8MaxTokens + 1}) {
    EXPECT_EQ(cuda::LaunchMoeW4a8Layer(r, reinterpret_cast<const uint16_t*>(out),
                                       reinterpret_cast<const int32_t*>(out), out, T, 4, kLimit,
                                       kAlpha, out, out, 1 << 30, nullptr, nullptr),
              cudaErrorInvalidValue);
  }
  cudaFree(out);
  cuda::FreeMoeW4a8(&r);
}

// Small shape uploaded from host tensors (the path real checkpoints take),
// with scales spread over 2^-20 .. 2^3 including the subnormal-producing ones.
TEST_F(MoeCudaTest, SmallShapeFromHostUpload) {
  HostMoe m;
  m.E = 8, m.H = 256, m.I = 96;  // I/32 = 3 blocks per row: lanes past the row end idle
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> byte(0, 255), scale(107, 130);
  std::uniform_real_distribution<float> bias(-0.5f, 0.5f);
  size_t E = m.E, H = m.H, I = m.I;
  m.gu_blocks.resize(E * 2 * I * H / 2), m.gu_scales.resize(E * 2 * I * H / 32);
  m.d_blocks.resize(E * H * I / 2), m.d_scales.resize(E * H * I / 32);
  m.gu_bias.resize(E * 2 * I), m.d_bias.resize(E * H);
  for (auto& v : m.gu_blocks) v = byte(rng);
  for (auto& v : m.d_blocks) v = byte(rng);
  for (auto& v : m.gu_scales) v = scale(rng) - 8;  // 2^-28 .. 2^-5
  for (auto& v : m.d_scales) v = scale(rng);
  for (auto& v : m.gu_bias) v = FloatToBf16(bias(rng));
  for (auto& v : m.d_bias) v = FloatToBf16(bias(rng));
  cuda::MoeDeviceWeights w;
  ASSERT_EQ(cuda::AllocMoeWeights(m.E, m.H, m.I, &w), cudaSuccess);
  for (int e = 0; e < m.E; ++e) {
    ASSERT_EQ(
        cuda::UploadMoeExpert(w, e, m.gu_blocks.data() + e * 2 * I * H / 2,
                              m.gu_scales.data() + e * 2 * I * H / 32, m.gu_bias.data() + e * 2 * I,
                              m.d_blocks.data() + e * H * I / 2, m.d_scales.data() + e * H * I / 32,
                              m.d_bias.data() + e * H, nullptr),
        cudaSuccess);
  }
  CheckLayer(w, m, 1, 2, 5);
  CheckLayer(w, m, 37, 2, 6);   // several tokens per expert
  CheckLayer(w, m, 300, 8, 7);  // every expert, top_k = E
  // The same through the grouped GEMMs (I = 96: a half stage of reduction in
  // down, a half tile of features in gate_up), then through the decode kernels.
  for (int min_pairs : {0, -1}) {
    cuda::MoeTuning t;
    t.gemm_min_pairs_per_expert = min_pairs;
    CheckLayer(w, m, 1, 2, 8, /*bad_ids=*/0, /*deterministic=*/false, t);
    CheckLayer(w, m, 37, 2, 9, /*bad_ids=*/0, /*deterministic=*/false, t);
    CheckLayer(w, m, 300, 8, 10, /*bad_ids=*/0, /*deterministic=*/false, t);
  }
  // The FP8 decode path: blocks more than 2^14 below their row's largest are
  // flushed (scales here span 2^23), down's reduction in three parts of one
  // block; every expert 4 pairs (down in two passes), then repeated ids
  // (5 or more pairs: gate_up in two passes).
  cuda::MoeW4a8Weights r;
  ASSERT_EQ(cuda::RelayMoeW4a8(w, &r, nullptr), cudaSuccess);
  EXPECT_GT(r.flushed_blocks, 0);
  for (int T : {1, 4}) CheckLayer(w, m, T, 2, 20 + T, 0, /*deterministic=*/false, {}, &r);
  CheckLayer(w, m, 4, 8, 25, /*bad_ids=*/0, /*deterministic=*/false, {}, &r);
  CheckLayer(w, m, 4, 8, 26, /*bad_ids=*/6, /*deterministic=*/false, {}, &r);
  cuda::FreeMoeW4a8(&r);
  cuda::FreeMoeWeights(&w);
}

TEST_F(MoeCudaTest, RouteGroupsPairsByExpertAndCountsInvalidIds) {
  const int E = 6;
  std::vector<int32_t> ids = {3, 0, 3, 5, -1, 3, 0, 6, 5, 3};
  const int P = ids.size();
  int32_t* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, (P + E + E + 1 + P + E + 2) * 4), cudaSuccess);
  int32_t *ids_d = d, *count = d + P, *offset = count + E, *pair_of = offset + E + 1,
          *active = pair_of + P, *num_active = active + E, *invalid = num_active + 1;
  ASSERT_EQ(cudaMemcpy(ids_d, ids.data(), P * 4, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cuda::LaunchMoeRoute(ids_d, P, E, count, offset, pair_of, active, num_active, invalid,
                                 nullptr),
            cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(ToHost(count, E), (std::vector<int32_t>{2, 0, 0, 4, 0, 2}));
  EXPECT_EQ(ToHost(offset, E + 1), (std::vector<int32_t>{0, 2, 2, 2, 6, 6, 8}));
  EXPECT_EQ(ToHost(num_active, 1)[0], 3);
  std::vector<int32_t> act = ToHost(active, 3);
  EXPECT_EQ(act, (std::vector<int32_t>{0, 3, 5}));
  EXPECT_EQ(ToHost(invalid, 1)[0], 2);
  std::vector<int32_t> po = ToHost(pair_of, 8);
  std::sort(po.begin(), po.begin() + 2), std::sort(po.begin() + 2, po.begin() + 6),
      std::sort(po.begin() + 6, po.end());
  EXPECT_EQ(po, (std::vector<int32_t>{1, 6, 0, 2, 5, 9, 3, 8}));
  cudaFree(d);
}

TEST_F(MoeCudaTest, RejectsBadArguments) {
  cuda::MoeDeviceWeights w;
  EXPECT_EQ(cuda::AllocMoeWeights(8, 100, 64, &w), cudaErrorInvalidValue);   // H % 32
  EXPECT_EQ(cuda::AllocMoeWeights(8, 64, 8192, &w), cudaErrorInvalidValue);  // I too big
  EXPECT_EQ(cuda::AllocMoeWeights(0, 64, 64, &w), cudaErrorInvalidValue);
  ASSERT_EQ(cuda::AllocMoeWeights(4, 64, 64, &w), cudaSuccess);
  EXPECT_EQ(
      cuda::UploadMoeExpert(w, 4, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr),
      cudaErrorInvalidValue);
  void* ws = nullptr;
  size_t need = cuda::MoeWorkspaceBytes(w, 2, 2);
  ASSERT_EQ(cudaMalloc(&ws, need), cudaSuccess);
  uint16_t* x = nullptr;
  float* out = nullptr;
  int32_t* ids = nullptr;
  ASSERT_EQ(cudaMalloc(&x, 256), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&out, 512), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&ids, 64), cudaSuccess);
  float* tw = out;
  EXPECT_EQ(cuda::LaunchMoeLayer(w, x, ids, tw, 2, 2, kLimit, kAlpha, out, ws, need - 1, nullptr,
                                 nullptr),
            cudaErrorInvalidValue);  // workspace too small
  EXPECT_EQ(
      cuda::LaunchMoeLayer(w, x, ids, tw, 2, 5, kLimit, kAlpha, out, ws, need, nullptr, nullptr),
      cudaErrorInvalidValue);  // top_k > experts
  EXPECT_EQ(
      cuda::LaunchMoeLayer(w, x, ids, tw, -1, 2, kLimit, kAlpha, out, ws, need, nullptr, nullptr),
      cudaErrorInvalidValue);
  EXPECT_EQ(
      cuda::LaunchMoeLayer(w, x, ids, tw, 0, 2, kLimit, kAlpha, out, ws, need, nullptr, nullptr),
      cudaSuccess);  // nothing to do
  cudaFree(x), cudaFree(out), cudaFree(ids), cudaFree(ws);
  cuda::FreeMoeWeights(&w);
}

}  // namespace
}  // namespace flotilla::kernels
