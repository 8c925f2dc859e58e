// The CUDA dense ops against the CPU reference (kernels/cpu/ops.h) at
// gpt-oss-120b shapes: H = 2880, 64 q heads / 8 kv heads of head_dim 64,
// E = 128 experts with K = 4, projections QKV 2880->5120, O 4096->2880,
// router 2880->128 and lm_head 2880->201088, T in {1, 7, 64, 300}.
//
// Tolerances:
// - Embedding, the residual add, V in the cache and the router ids: exact
//   (copies, one f32 add, one rounding to bf16, comparisons).
// - bf16 outputs (RMSNorm, RoPE'd q and k): the f32 math differs from the CPU
//   only in the order of the 2880-term sum of squares, contraction into FMAs
//   and cos/sin ulps, ~1e-6 relative, which can move a value across a bf16
//   rounding boundary: we allow 1 bf16 ulp of the CPU's f32 value (plus 1e-5
//   absolute for results near 0 after cancellation in the rotation).
// - Linear: products of two bf16 are exact in f32 on both sides; only the
//   order of the additions differs (per-warp slices and tensor-core
//   accumulation, or cuBLASLt's tiling). Error ~ n * 2^-24 * the partial sums'
//   size; we allow 2e-4 * sqrt(in) * rms(x) * rms(w) (the spread of one dot
//   product, ~1), about 1% of what a single wrong weight element moves it.
// - Router weights: one expf and a division on 4 values, 1e-6 absolute.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "common/bf16.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/moe.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/router.h"
#include "tests/kernels/cuda_test_util.h"

namespace flotilla::kernels {
namespace {

constexpr float kEps = 1e-5f;
const int kTokenCounts[] = {1, 7, 64, 300};

class OpsCudaTest : public CudaTest {};

std::vector<float> Normal(size_t n, float sd, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, sd);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// Fast deterministic bf16 fill for large weights: roughly uniform in [-a, a].
std::vector<uint16_t> FastBf16(size_t n, float a, uint64_t seed) {
  std::vector<uint16_t> v(n);
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < n; ++i) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    const float u = static_cast<float>(s >> 40) * (1.0f / 16777216.0f);
    v[i] = FloatToBf16((2.0f * u - 1.0f) * a);
  }
  return v;
}

std::vector<uint16_t> ToBf16(const std::vector<float>& v) {
  std::vector<uint16_t> o(v.size());
  for (size_t i = 0; i < v.size(); ++i) o[i] = FloatToBf16(v[i]);
  return o;
}

std::vector<float> FromBf16(const std::vector<uint16_t>& v) {
  std::vector<float> o(v.size());
  for (size_t i = 0; i < v.size(); ++i) o[i] = Bf16ToFloat(v[i]);
  return o;
}

TEST_F(OpsCudaTest, EmbeddingGathersRowsAndCountsBadIds) {
  const int vocab = 4096;  // rows of the real width; fewer of them keeps the test fast
  std::vector<uint16_t> table = FastBf16(static_cast<size_t>(vocab) * kHidden, 1.0f, 1);
  Dev<uint16_t> d_table(table);
  for (int T : kTokenCounts) {
    std::mt19937 rng(T);
    std::vector<int32_t> ids(T);
    for (int& id : ids) id = static_cast<int>(rng() % vocab);
    if (T >= 7) {
      ids[1] = -1;
      ids[5] = vocab;
    }
    Dev<int32_t> d_ids(ids);
    Dev<float> d_out(static_cast<size_t>(T) * kHidden);
    Dev<int32_t> d_bad(std::vector<int32_t>{0});
    ASSERT_EQ(cuda::LaunchEmbedding(d_table.p, vocab, kHidden, d_ids.p, T, d_out.p, d_bad.p,
                                    nullptr),
              cudaSuccess);
    std::vector<float> out = d_out.Get();
    int bad = 0;
    for (int t = 0; t < T; ++t) {
      const bool ok = ids[t] >= 0 && ids[t] < vocab;
      bad += !ok;
      for (int c = 0; c < kHidden; ++c) {
        const float want =
            ok ? Bf16ToFloat(table[static_cast<size_t>(ids[t]) * kHidden + c]) : 0.0f;
        ASSERT_EQ(out[static_cast<size_t>(t) * kHidden + c], want) << "t=" << t << " c=" << c;
      }
    }
    EXPECT_EQ(d_bad.Get()[0], bad);
  }
}

TEST_F(OpsCudaTest, AddRmsNormMatchesCpu) {
  std::vector<uint16_t> weight = ToBf16(Normal(kHidden, 0.3f, 7));
  for (uint16_t& w : weight) w = FloatToBf16(1.0f + Bf16ToFloat(w));
  Dev<uint16_t> d_w(weight);
  for (int T : kTokenCounts) {
    const size_t n = static_cast<size_t>(T) * kHidden;
    std::vector<float> x = Normal(n, 2.0f, 100 + T), add = Normal(n, 1.0f, 200 + T);
    Dev<float> d_x(x), d_add(add);
    Dev<uint16_t> d_out(n);
    ASSERT_EQ(cuda::LaunchAddRmsNorm(d_x.p, d_add.p, d_w.p, T, kHidden, kEps, d_out.p, nullptr),
              cudaSuccess);
    std::vector<float> sum(n), ref(n);
    for (size_t i = 0; i < n; ++i) sum[i] = x[i] + add[i];
    cpu::RmsNorm(sum.data(), weight.data(), T, kHidden, kEps, ref.data());
    std::vector<float> gx = d_x.Get();
    std::vector<uint16_t> out = d_out.Get();
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(gx[i], sum[i]) << i;
      ASSERT_LE(std::fabs(Bf16ToFloat(out[i]) - ref[i]), Bf16Ulp(ref[i])) << "T=" << T << " i=" << i;
    }
    // No residual: x unchanged; and the row-subset variant.
    ASSERT_EQ(cuda::LaunchAddRmsNorm(d_x.p, nullptr, d_w.p, T, kHidden, kEps, d_out.p, nullptr),
              cudaSuccess);
    out = d_out.Get();
    for (size_t i = 0; i < n; ++i) {
      ASSERT_LE(std::fabs(Bf16ToFloat(out[i]) - ref[i]), Bf16Ulp(ref[i])) << i;
    }
    std::vector<int32_t> rows;
    for (int t = T - 1; t >= 0; t -= 3) rows.push_back(t);
    Dev<int32_t> d_rows(rows);
    Dev<uint16_t> d_sel(rows.size() * kHidden);
    ASSERT_EQ(cuda::LaunchRmsNormRows(d_x.p, d_rows.p, static_cast<int>(rows.size()), d_w.p,
                                      kHidden, kEps, d_sel.p, nullptr),
              cudaSuccess);
    std::vector<uint16_t> sel = d_sel.Get();
    for (size_t i = 0; i < rows.size(); ++i) {
      for (int c = 0; c < kHidden; ++c) {
        const float r = ref[static_cast<size_t>(rows[i]) * kHidden + c];
        ASSERT_LE(std::fabs(Bf16ToFloat(sel[i * kHidden + c]) - r), Bf16Ulp(r));
      }
    }
  }
}

struct LinearShape {
  const char* name;
  int in, out;
  bool bias;
  int row_step;  // check every row_step-th output row (lm_head: a CPU reference of all is slow)
};

void CheckLinear(cuda::LinearContext* ctx, const LinearShape& s, int T, bool accumulate,
                 cpu::ThreadPool* pool, const std::vector<uint16_t>& w, const uint16_t* d_w,
                 const std::vector<uint16_t>& bias, const uint16_t* d_bias) {
  SCOPED_TRACE(::testing::Message() << s.name << " T=" << T << " accumulate=" << accumulate);
  std::vector<uint16_t> xb = ToBf16(Normal(static_cast<size_t>(T) * s.in, 1.0f, 300 + T));
  std::vector<float> x = FromBf16(xb);
  Dev<uint16_t> d_x(xb);
  const size_t ny = static_cast<size_t>(T) * s.out;
  std::vector<float> y0 = accumulate ? Normal(ny, 1.0f, 400 + T) : std::vector<float>(ny, 7.0f);
  Dev<float> d_y(y0);
  ASSERT_EQ(cuda::LaunchLinear(ctx, d_x.p, d_w, s.bias ? d_bias : nullptr, T, s.in, s.out,
                               accumulate, d_y.p, nullptr),
            cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<float> y = d_y.Get();
  // Reference on rows o = 0, step, 2 step, ... (LinearBf16 takes a row stride).
  const int n_rows = (s.out + s.row_step - 1) / s.row_step;
  std::vector<float> ref(static_cast<size_t>(T) * n_rows);
  cpu::LinearBf16(pool, x.data(), T, s.in, w.data(), static_cast<int64_t>(s.in) * s.row_step,
                  n_rows, nullptr, ref.data());
  double xs = 0, ws = 0;
  for (float v : x) xs += static_cast<double>(v) * v;
  for (size_t i = 0; i < w.size(); i += 97) ws += std::pow(Bf16ToFloat(w[i]), 2.0);
  const double rms_x = std::sqrt(xs / x.size()), rms_w = std::sqrt(ws / ((w.size() + 96) / 97));
  const float tol = static_cast<float>(2e-4 * std::sqrt(static_cast<double>(s.in)) * rms_x * rms_w);
  for (int t = 0; t < T; ++t) {
    for (int j = 0; j < n_rows; ++j) {
      const int o = j * s.row_step;
      float want = ref[static_cast<size_t>(t) * n_rows + j];
      if (s.bias) want += Bf16ToFloat(bias[o]);
      if (accumulate) want += y0[static_cast<size_t>(t) * s.out + o];
      ASSERT_NEAR(y[static_cast<size_t>(t) * s.out + o], want, tol) << "t=" << t << " o=" << o;
    }
  }
}

TEST_F(OpsCudaTest, LinearMatchesCpuAtGptOssShapes) {
  cuda::LinearContext* ctx = nullptr;
  ASSERT_EQ(cuda::CreateLinearContext(&ctx), cudaSuccess);
  std::printf("[ linear ] large batches via %s\n",
              cuda::LinearUsesCublasLt(ctx) ? "cuBLASLt" : "the GEMV over 16-token slices");
  cpu::ThreadPool pool(0);
  const LinearShape shapes[] = {{"qkv", 2880, 5120, true, 1},
                                {"o", 4096, 2880, false, 1},
                                {"router", 2880, 128, true, 1},
                                {"lm_head", 2880, 201088, false, 61}};
  for (const LinearShape& s : shapes) {
    const float a = 0.035f;  // uniform in [-a, a]: rms 0.02
    std::vector<uint16_t> w = FastBf16(static_cast<size_t>(s.out) * s.in, a, s.out);
    std::vector<uint16_t> bias = ToBf16(Normal(s.out, 0.1f, 11));
    Dev<uint16_t> d_w(w), d_bias(bias);
    std::vector<int> counts(std::begin(kTokenCounts), std::end(kTokenCounts));
    if (s.out == 5120) {
      counts.push_back(16);  // the last small-batch size
      counts.push_back(17);  // the first large-batch size
    }
    for (int T : counts) {
      CheckLinear(ctx, s, T, false, &pool, w, d_w.p, bias, d_bias.p);
      // Accumulating: the O projection and the router (as the engine runs it)
      // split their input over several blocks at small T.
      if (s.out == 2880 || s.out == 5120 || s.out == 128) {
        CheckLinear(ctx, s, T, true, &pool, w, d_w.p, bias, d_bias.p);
      }
    }
  }
  cuda::DestroyLinearContext(ctx);
}

// Both paths replay inside a CUDA graph with the same results as direct launches.
TEST_F(OpsCudaTest, LinearIsGraphCapturable) {
  cuda::LinearContext* ctx = nullptr;
  ASSERT_EQ(cuda::CreateLinearContext(&ctx), cudaSuccess);
  const int in = 2880, out = 5120;
  std::vector<uint16_t> w = FastBf16(static_cast<size_t>(out) * in, 0.035f, 5);
  std::vector<uint16_t> bias = ToBf16(Normal(out, 0.1f, 6));
  Dev<uint16_t> d_w(w), d_bias(bias);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  for (int T : {7, 64}) {
    Dev<uint16_t> d_x(ToBf16(Normal(static_cast<size_t>(T) * in, 1.0f, T)));
    Dev<float> d_direct(static_cast<size_t>(T) * out), d_graph(static_cast<size_t>(T) * out);
    ASSERT_EQ(cuda::LaunchLinear(ctx, d_x.p, d_w.p, d_bias.p, T, in, out, false, d_direct.p,
                                 stream),
              cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    cudaGraph_t graph;
    ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
    ASSERT_EQ(cuda::LaunchLinear(ctx, d_x.p, d_w.p, d_bias.p, T, in, out, false, d_graph.p,
                                 stream),
              cudaSuccess);
    ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
    cudaGraphExec_t exec;
    ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    EXPECT_EQ(d_graph.Get(), d_direct.Get()) << "T=" << T;
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
  cudaStreamDestroy(stream);
  cuda::DestroyLinearContext(ctx);
}

TEST_F(OpsCudaTest, RopeKvWriteMatchesCpu) {
  cpu::YarnParams yp;  // gpt-oss: theta 150000, factor 32, original 4096, head_dim 64
  const std::vector<float> inv_freq = cpu::YarnInvFreq(yp);
  const float scaling = cpu::YarnAttentionScaling(yp.factor);
  Dev<float> d_inv(inv_freq);
  const int width = (kQHeads + 2 * kKvHeads) * kHeadDim;
  for (int block_size : {16, 64}) {
    for (int T : kTokenCounts) {
      SCOPED_TRACE(::testing::Message() << "block_size=" << block_size << " T=" << T);
      const int num_blocks = (T + block_size - 1) / block_size * 2 + 1;
      const size_t cache_elems = static_cast<size_t>(num_blocks) * kKvHeads * block_size * kHeadDim;
      std::mt19937 rng(T * 31 + block_size);
      std::vector<float> qkv = Normal(static_cast<size_t>(T) * width, 1.0f, 500 + T);
      std::vector<int32_t> pos(T), slots(T);
      std::vector<int32_t> all(num_blocks * block_size);
      std::iota(all.begin(), all.end(), 0);
      std::shuffle(all.begin(), all.end(), rng);
      for (int t = 0; t < T; ++t) {
        pos[t] = t == 0 ? 131071 : static_cast<int>(rng() % 131072);
        slots[t] = (t % 5 == 3) ? -1 : all[t];
      }
      Dev<float> d_qkv(qkv);
      Dev<int32_t> d_pos(pos), d_slots(slots);
      std::vector<uint16_t> sentinel(cache_elems, 0x7FC1);
      Dev<uint16_t> d_k(sentinel), d_v(sentinel), d_q(static_cast<size_t>(T) * kQHeads * kHeadDim);
      cuda::PagedKvLayer cache;
      cache.k = d_k.p, cache.v = d_v.p, cache.num_blocks = num_blocks;
      cache.block_size = block_size, cache.kv_heads = kKvHeads, cache.head_dim = kHeadDim;
      ASSERT_EQ(cuda::LaunchRopeKvWrite(d_qkv.p, d_pos.p, d_slots.p, T, kQHeads, d_inv.p, scaling,
                                        cache, d_q.p, nullptr),
                cudaSuccess);
      // CPU: split q | k | v, rotate q and k.
      std::vector<float> q(static_cast<size_t>(T) * kQHeads * kHeadDim),
          k(static_cast<size_t>(T) * kKvHeads * kHeadDim), v(k.size());
      for (int t = 0; t < T; ++t) {
        const float* src = qkv.data() + static_cast<size_t>(t) * width;
        std::copy(src, src + kQHeads * kHeadDim, q.data() + static_cast<size_t>(t) * kQHeads * kHeadDim);
        src += kQHeads * kHeadDim;
        std::copy(src, src + kKvHeads * kHeadDim, k.data() + static_cast<size_t>(t) * kKvHeads * kHeadDim);
        src += kKvHeads * kHeadDim;
        std::copy(src, src + kKvHeads * kHeadDim, v.data() + static_cast<size_t>(t) * kKvHeads * kHeadDim);
      }
      std::vector<int64_t> pos64(pos.begin(), pos.end());
      cpu::ApplyRope(q.data(), T, kQHeads, kHeadDim, pos64.data(), inv_freq.data(), scaling);
      cpu::ApplyRope(k.data(), T, kKvHeads, kHeadDim, pos64.data(), inv_freq.data(), scaling);
      std::vector<uint16_t> gq = d_q.Get(), gk = d_k.Get(), gv = d_v.Get();
      for (size_t i = 0; i < q.size(); ++i) {
        ASSERT_LE(std::fabs(Bf16ToFloat(gq[i]) - q[i]), Bf16Ulp(q[i]) + 1e-5f) << "q " << i;
      }
      std::vector<char> written(cache_elems, 0);
      for (int t = 0; t < T; ++t) {
        if (slots[t] < 0) continue;
        const int b = slots[t] / block_size, off = slots[t] % block_size;
        for (int h = 0; h < kKvHeads; ++h) {
          for (int d = 0; d < kHeadDim; ++d) {
            const size_t c = ((static_cast<size_t>(b) * kKvHeads + h) * block_size + off) * kHeadDim + d;
            const size_t s = (static_cast<size_t>(t) * kKvHeads + h) * kHeadDim + d;
            written[c] = 1;
            ASSERT_LE(std::fabs(Bf16ToFloat(gk[c]) - k[s]), Bf16Ulp(k[s]) + 1e-5f) << "k t=" << t;
            ASSERT_EQ(gv[c], FloatToBf16(v[s])) << "v t=" << t;
          }
        }
      }
      for (size_t c = 0; c < cache_elems; ++c) {
        if (!written[c]) {
          ASSERT_EQ(gk[c], 0x7FC1) << c;
          ASSERT_EQ(gv[c], 0x7FC1) << c;
        }
      }
    }
  }
}

TEST_F(OpsCudaTest, RouterTopKMatchesCpu) {
  const int E = 128, K = 4;
  for (int T : kTokenCounts) {
    // Logits on a 1/4 grid so that ties occur and must go to the lower id.
    std::vector<float> logits = Normal(static_cast<size_t>(T) * E, 1.5f, 600 + T);
    for (float& l : logits) l = std::round(l * 4.0f) / 4.0f;
    Dev<float> d_l(logits);
    Dev<int32_t> d_ids(static_cast<size_t>(T) * K);
    Dev<float> d_w(static_cast<size_t>(T) * K);
    ASSERT_EQ(cuda::LaunchRouterTopK(d_l.p, T, E, K, d_ids.p, d_w.p, nullptr), cudaSuccess);
    std::vector<int32_t> ids(static_cast<size_t>(T) * K);
    std::vector<float> w(ids.size());
    cpu::RouterTopK(logits.data(), T, E, K, ids.data(), w.data());
    EXPECT_EQ(d_ids.Get(), ids) << "T=" << T;
    std::vector<float> gw = d_w.Get();
    for (size_t i = 0; i < w.size(); ++i) ASSERT_NEAR(gw[i], w[i], 1e-6f) << "T=" << T;
    // Clearing: the same result, and the logits are zero afterwards.
    Dev<int32_t> d_ids2(static_cast<size_t>(T) * K);
    ASSERT_EQ(cuda::LaunchRouterTopK(d_l.p, T, E, K, d_ids2.p, d_w.p, nullptr, true), cudaSuccess);
    EXPECT_EQ(d_ids2.Get(), ids) << "T=" << T;
    EXPECT_EQ(d_l.Get(), std::vector<float>(logits.size(), 0.0f)) << "T=" << T;
  }
}

// The norm fused into the GEMV against AddRmsNorm followed by LaunchLinear
// on the same device: the normalised rows it writes equal AddRmsNorm's except
// where the last bit of 1/rms differs (at most 1 bf16 ulp, in under 1% of
// the values); the projection matches within 1e-3 * max(1, max|y|) (f32
// summation order and those ulps). Router (accumulating, split over 88
// blocks) and a QKV-sized projection, 1 to 8 tokens.
TEST_F(OpsCudaTest, NormLinearMatchesNormThenLinear) {
  cuda::LinearContext* ctx = nullptr;
  ASSERT_EQ(cuda::CreateLinearContext(&ctx), cudaSuccess);
  struct Case {
    int in, out;
    bool accumulate;
  } cases[] = {{2880, 128, true}, {2880, 5120, false}, {96, 40, true}};
  for (const Case& c : cases) {
    std::vector<uint16_t> w = FastBf16(static_cast<size_t>(c.out) * c.in, 0.035f, c.out);
    std::vector<uint16_t> bias = ToBf16(Normal(c.out, 0.1f, 21));
    std::vector<uint16_t> nw = ToBf16(Normal(c.in, 0.2f, 22));
    for (uint16_t& v : nw) v = FloatToBf16(1.0f + Bf16ToFloat(v));
    Dev<uint16_t> d_w(w), d_bias(bias), d_nw(nw);
    for (int T : {1, 3, 8}) {
      SCOPED_TRACE(::testing::Message() << "in=" << c.in << " out=" << c.out << " T=" << T);
      std::vector<float> x = Normal(static_cast<size_t>(T) * c.in, 1.3f, 30 + T);
      std::vector<float> y0 = c.accumulate ? Normal(static_cast<size_t>(T) * c.out, 1.0f, 40 + T)
                                           : std::vector<float>(size_t(T) * c.out, 0.0f);
      Dev<float> d_x(x), d_xr(x), d_y(y0), d_ref(y0);
      Dev<uint16_t> d_t(static_cast<size_t>(T) * c.in), d_tr(static_cast<size_t>(T) * c.in);
      ASSERT_EQ(cuda::LaunchAddRmsNorm(d_xr.p, nullptr, d_nw.p, T, c.in, kEps, d_tr.p, nullptr),
                cudaSuccess);
      ASSERT_EQ(cuda::LaunchLinear(ctx, d_tr.p, d_w.p, d_bias.p, T, c.in, c.out, c.accumulate,
                                   d_ref.p, nullptr),
                cudaSuccess);
      ASSERT_EQ(cuda::LaunchNormLinear(d_x.p, d_nw.p, kEps, d_w.p, d_bias.p, T, c.in, c.out,
                                       c.accumulate, d_y.p, d_t.p, nullptr),
                cudaSuccess);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      EXPECT_EQ(d_x.Get(), x) << "the residual is read only";
      const std::vector<uint16_t> t = d_t.Get(), tr = d_tr.Get();
      size_t differ = 0;
      for (size_t i = 0; i < t.size(); ++i) {
        if (t[i] == tr[i]) continue;
        ++differ;
        ASSERT_LE(std::abs(static_cast<int>(t[i]) - static_cast<int>(tr[i])), 1) << i;
      }
      EXPECT_LE(differ, t.size() / 100 + 1);
      const std::vector<float> y = d_y.Get(), ref = d_ref.Get();
      float max_ref = 1.0f;
      for (float v : ref) max_ref = std::max(max_ref, std::fabs(v));
      for (size_t i = 0; i < y.size(); ++i) ASSERT_NEAR(y[i], ref[i], 1e-3f * max_ref) << i;
    }
  }
  float* y = nullptr;
  EXPECT_EQ(cuda::LaunchNormLinear(nullptr, nullptr, kEps, nullptr, nullptr, 1, 2880, 128, true, y,
                                   nullptr, nullptr),
            cudaErrorInvalidValue);
  cuda::DestroyLinearContext(ctx);
}

// A router on the device: its projection (E x in), bias, post-attention
// norm weights near 1 (seeds `seed` and `seed + 1`) and a zeroed ranking
// counter.
struct DevRouter {
  static std::vector<uint16_t> NormWeights(int in, uint32_t seed) {
    std::vector<uint16_t> nw = ToBf16(Normal(in, 0.2f, seed));
    for (uint16_t& v : nw) v = FloatToBf16(1.0f + Bf16ToFloat(v));
    return nw;
  }
  DevRouter(int in, int E, uint32_t seed)
      : w(FastBf16(static_cast<size_t>(E) * in, 0.035f, E)),
        bias(ToBf16(Normal(E, 0.1f, seed))),
        nw(NormWeights(in, seed + 1)),
        done(std::vector<unsigned>{0}) {}
  Dev<uint16_t> w, bias, nw;
  Dev<unsigned> done;
};

// The router in one launch against the norm-fused projection and the CPU
// ranking of its logits: the same experts (unless the k-th and the next are
// within the projection's summation noise), their softmax weights, the
// normalised rows bit for bit, and the logits and the counter left zero, so
// a second launch gives the same.
TEST_F(OpsCudaTest, NormLinearTopKMatchesNormLinearThenRanking) {
  const int in = 2880, E = 128, K = 4;
  const DevRouter r(in, E, 21);
  for (int T : {1, 3, 8}) {
    SCOPED_TRACE(::testing::Message() << "T=" << T);
    const std::vector<float> x = Normal(static_cast<size_t>(T) * in, 1.3f, 50 + T);
    const std::vector<float> zero(static_cast<size_t>(T) * E, 0.0f);
    Dev<float> d_x(x), d_ref(zero), d_logits(zero);
    Dev<uint16_t> d_tr(static_cast<size_t>(T) * in), d_t(static_cast<size_t>(T) * in);
    Dev<int32_t> d_ids(static_cast<size_t>(T) * K);
    Dev<float> d_wk(static_cast<size_t>(T) * K);
    ASSERT_EQ(cuda::LaunchNormLinear(d_x.p, r.nw.p, kEps, r.w.p, r.bias.p, T, in, E, true, d_ref.p,
                                     d_tr.p, nullptr),
              cudaSuccess);
    const std::vector<float> ref = d_ref.Get();
    for (int launch = 0; launch < 2; ++launch) {
      ASSERT_EQ(
          cuda::LaunchNormLinearTopK(d_x.p, r.nw.p, kEps, r.w.p, r.bias.p, T, in, E, d_logits.p,
                                     d_t.p, K, d_ids.p, d_wk.p, r.done.p, nullptr),
          cudaSuccess);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      EXPECT_EQ(d_logits.Get(), zero) << "launch " << launch;
      EXPECT_EQ(r.done.Get(), std::vector<unsigned>{0}) << "launch " << launch;
      EXPECT_EQ(d_t.Get(), d_tr.Get()) << "launch " << launch;
      std::vector<int32_t> want(static_cast<size_t>(T) * K);
      std::vector<float> want_w(want.size());
      cpu::RouterTopK(ref.data(), T, E, K, want.data(), want_w.data());
      const std::vector<int32_t> ids = d_ids.Get();
      const std::vector<float> got_w = d_wk.Get();
      for (int t = 0; t < T; ++t) {
        std::vector<float> row(ref.begin() + static_cast<size_t>(t) * E,
                               ref.begin() + static_cast<size_t>(t + 1) * E);
        std::sort(row.begin(), row.end(), std::greater<float>());
        if (row[K - 1] - row[K] < 1e-3f) continue;  // a near tie: either order is right
        for (int j = 0; j < K; ++j) {
          const size_t i = static_cast<size_t>(t) * K + j;
          ASSERT_EQ(ids[i], want[i]) << "token " << t << " choice " << j;
          ASSERT_NEAR(got_w[i], want_w[i], 1e-4f) << "token " << t << " choice " << j;
        }
      }
    }
  }
  float* y = nullptr;
  EXPECT_EQ(cuda::LaunchNormLinearTopK(nullptr, nullptr, kEps, nullptr, nullptr, 1, in, E, y,
                                       nullptr, K, nullptr, nullptr, nullptr, nullptr),
            cudaErrorInvalidValue);
}

// The router's kernel writing the MoE's routing and f16 x (MoeRouteTargets)
// and the layer launched `routed`: the same output bits as the layer routing
// on its own (deterministic mode on both), on the fused decode launch (1 and
// 3 tokens), the two-launch one (8) and the grouped GEMMs; the counts,
// offsets and touched experts as the CPU groups the chosen ids.
TEST_F(OpsCudaTest, NormLinearTopKRoutesTheMoeLayer) {
  const int in = 2880, E = 128, K = 4, I = 256;
  const DevRouter r(in, E, 31);
  cuda::MoeDeviceWeights moe;
  ASSERT_EQ(cuda::AllocMoeWeights(E, in, I, &moe), cudaSuccess);
  ASSERT_EQ(cuda::LaunchFillMoeWeightsSynthetic(moe, 7, nullptr), cudaSuccess);
  cuda::MoeTuning gemm;
  gemm.gemm_min_pairs_per_expert = 0;
  for (const cuda::MoeTuning& tuning : {cuda::MoeTuning{}, gemm}) {
    for (int T : {1, 3, 8}) {
      SCOPED_TRACE(::testing::Message() << "T=" << T << " gemm " << (&tuning == &gemm));
      const std::vector<float> x = Normal(static_cast<size_t>(T) * in, 1.3f, 60 + T);
      const std::vector<float> zero(static_cast<size_t>(T) * E, 0.0f);
      const size_t ws_bytes = cuda::MoeWorkspaceBytes(moe, T, K, /*deterministic=*/true);
      Dev<float> d_x(x), d_logits(zero);
      Dev<uint16_t> d_t(static_cast<size_t>(T) * in);
      Dev<int32_t> d_ids(static_cast<size_t>(T) * K), d_invalid(1);
      Dev<float> d_wk(static_cast<size_t>(T) * K);
      std::vector<std::vector<float>> outs;
      for (bool routed : {false, true}) {
        Dev<uint8_t> ws(ws_bytes);
        Dev<float> out(static_cast<size_t>(T) * in);
        const cuda::MoeRouteTargets targets =
            cuda::MoeRouteTargetsIn(moe, T, K, true, ws.p, d_invalid.p);
        ASSERT_EQ(
            cuda::LaunchNormLinearTopK(d_x.p, r.nw.p, kEps, r.w.p, r.bias.p, T, in, E, d_logits.p,
                                       d_t.p, K, d_ids.p, d_wk.p, r.done.p, nullptr,
                                       /*deterministic=*/true, routed ? &targets : nullptr),
            cudaSuccess);
        ASSERT_EQ(cuda::LaunchMoeLayer(moe, d_t.p, d_ids.p, d_wk.p, T, K, 7.0f, 1.702f, out.p, ws.p,
                                       ws_bytes, d_invalid.p, nullptr, true, tuning, routed),
                  cudaSuccess);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        outs.push_back(out.Get());
        if (!routed) continue;
        // The routing the router's kernel left, against the chosen ids.
        const std::vector<int32_t> ids = d_ids.Get();
        std::vector<int32_t> count(E, 0);
        for (int32_t id : ids) ++count[id];
        std::vector<int32_t> got_count(E), got_offset(E + 1), got_active(E), got_n(1);
        ASSERT_EQ(cudaMemcpy(got_count.data(), targets.count, E * 4, cudaMemcpyDeviceToHost),
                  cudaSuccess);
        ASSERT_EQ(
            cudaMemcpy(got_offset.data(), targets.offset, (E + 1) * 4, cudaMemcpyDeviceToHost),
            cudaSuccess);
        ASSERT_EQ(cudaMemcpy(got_active.data(), targets.active, E * 4, cudaMemcpyDeviceToHost),
                  cudaSuccess);
        ASSERT_EQ(cudaMemcpy(got_n.data(), targets.num_active, 4, cudaMemcpyDeviceToHost),
                  cudaSuccess);
        EXPECT_EQ(got_count, count);
        int run = 0, n = 0;
        for (int e = 0; e < E; ++e) {
          EXPECT_EQ(got_offset[e], run) << "expert " << e;
          run += count[e];
          if (count[e] > 0) {
            EXPECT_EQ(got_active[n++], e);
          }
        }
        EXPECT_EQ(got_offset[E], T * K);
        EXPECT_EQ(got_n[0], n);
        EXPECT_EQ(d_invalid.Get(), std::vector<int32_t>{0});
      }
      ASSERT_EQ(outs.size(), 2u);
      EXPECT_EQ(outs[1], outs[0]);
      float max_abs = 0;
      for (float v : outs[0]) max_abs = std::max(max_abs, std::fabs(v));
      EXPECT_GT(max_abs, 0.0f);  // the layer ran
    }
  }
  // Route targets without their buffers are refused before anything runs.
  Dev<float> d_x1(Normal(in, 1.0f, 70)), d_l1(std::vector<float>(E, 0.0f)), d_w1(K);
  Dev<int32_t> d_i1(K);
  cuda::MoeRouteTargets bad;
  bad.experts = E;
  EXPECT_EQ(cuda::LaunchNormLinearTopK(d_x1.p, r.nw.p, kEps, r.w.p, r.bias.p, 1, in, E, d_l1.p,
                                       nullptr, K, d_i1.p, d_w1.p, r.done.p, nullptr, false, &bad),
            cudaErrorInvalidValue);
  cuda::FreeMoeWeights(&moe);
}

// The router as one cluster (LaunchRouterCluster, which the engine's fused
// router takes) against the grid-wide kernel in deterministic mode: the same
// chosen experts and weights bit for bit, the same normalised rows and f16 x,
// and the same MoE routing, over shapes with 8 or 16 rows per CTA, a last CTA
// with no rows (129 experts) and a toy size; the logits and counter untouched.
TEST_F(OpsCudaTest, RouterClusterMatchesTheGridKernel) {
  struct Shape {
    int in, E, K;
  };
  const int I = 64;
  for (const Shape& sh : {Shape{2880, 128, 4}, Shape{2880, 32, 4}, Shape{2880, 256, 8},
                          Shape{2880, 129, 4}, Shape{64, 4, 2}}) {
    const DevRouter r(sh.in, sh.E, 41 + sh.E);
    cuda::MoeDeviceWeights moe;
    ASSERT_EQ(cuda::AllocMoeWeights(sh.E, sh.in, I, &moe), cudaSuccess);
    for (int T : {1, 3, 8}) {
      SCOPED_TRACE(::testing::Message() << "in=" << sh.in << " E=" << sh.E << " T=" << T);
      const std::vector<float> x = Normal(static_cast<size_t>(T) * sh.in, 1.3f, 80 + T);
      const std::vector<float> zero(static_cast<size_t>(T) * sh.E, 0.0f);
      const size_t ws_bytes = cuda::MoeWorkspaceBytes(moe, T, sh.K, /*deterministic=*/true);
      Dev<float> d_x(x), d_logits(zero);
      Dev<int32_t> d_invalid(1);
      struct Out {
        std::vector<int32_t> ids, count, offset, active, pairs;
        std::vector<float> weights;
        std::vector<uint16_t> t, xh;
      };
      std::vector<Out> outs;
      for (bool cluster : {false, true}) {
        Dev<uint8_t> ws(ws_bytes);
        Dev<uint16_t> d_t(static_cast<size_t>(T) * sh.in);
        Dev<int32_t> d_ids(static_cast<size_t>(T) * sh.K);
        Dev<float> d_wk(static_cast<size_t>(T) * sh.K);
        const cuda::MoeRouteTargets targets =
            cuda::MoeRouteTargetsIn(moe, T, sh.K, true, ws.p, d_invalid.p);
        if (cluster) {
          ASSERT_EQ(cuda::LaunchRouterCluster(d_x.p, r.nw.p, kEps, r.w.p, r.bias.p, T, sh.in, sh.E,
                                              d_t.p, sh.K, d_ids.p, d_wk.p, &targets, nullptr),
                    cudaSuccess)
              << "the cluster form runs on this device";
        } else {
          ASSERT_EQ(cuda::LaunchNormLinearTopK(d_x.p, r.nw.p, kEps, r.w.p, r.bias.p, T, sh.in, sh.E,
                                               d_logits.p, d_t.p, sh.K, d_ids.p, d_wk.p, r.done.p,
                                               nullptr, /*deterministic=*/true, &targets,
                                               /*one_cluster=*/false),
                    cudaSuccess);
        }
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        EXPECT_EQ(d_logits.Get(), zero);
        EXPECT_EQ(r.done.Get(), std::vector<unsigned>{0});
        Out o;
        o.ids = d_ids.Get();
        o.weights = d_wk.Get();
        o.t = d_t.Get();
        auto get = [](const int32_t* p, size_t n) {
          std::vector<int32_t> v(n);
          EXPECT_EQ(cudaMemcpy(v.data(), p, n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
          return v;
        };
        o.count = get(targets.count, sh.E);
        o.offset = get(targets.offset, sh.E + 1);
        o.active = get(targets.active, sh.E);
        o.pairs = get(targets.pair_of, static_cast<size_t>(T) * sh.K);
        for (int e = 0; e < sh.E; ++e) {  // the order within an expert is unspecified
          std::sort(o.pairs.begin() + o.offset[e], o.pairs.begin() + o.offset[e + 1]);
        }
        o.xh.resize(static_cast<size_t>(T) * sh.in);
        ASSERT_EQ(cudaMemcpy(o.xh.data(), targets.xh, o.xh.size() * 2, cudaMemcpyDeviceToHost),
                  cudaSuccess);
        outs.push_back(std::move(o));
      }
      EXPECT_EQ(outs[1].ids, outs[0].ids);
      EXPECT_EQ(outs[1].weights, outs[0].weights);
      EXPECT_EQ(outs[1].t, outs[0].t);
      EXPECT_EQ(outs[1].xh, outs[0].xh);
      EXPECT_EQ(outs[1].count, outs[0].count);
      EXPECT_EQ(outs[1].offset, outs[0].offset);
      EXPECT_EQ(outs[1].pairs, outs[0].pairs);
      const auto active = std::count_if(outs[0].count.begin(), outs[0].count.end(),
                                        [](int32_t c) { return c > 0; });
      EXPECT_EQ(std::vector<int32_t>(outs[1].active.begin(), outs[1].active.begin() + active),
                std::vector<int32_t>(outs[0].active.begin(), outs[0].active.begin() + active));
      for (size_t i = 0; i < outs[0].ids.size(); ++i) {
        ASSERT_GE(outs[0].ids[i], 0);
        ASSERT_LT(outs[0].ids[i], sh.E);
      }
    }
    cuda::FreeMoeWeights(&moe);
  }
  // Shapes it does not take are left to the caller, nothing launched.
  EXPECT_EQ(cuda::LaunchRouterCluster(nullptr, nullptr, kEps, nullptr, nullptr, 1, 2880, 257,
                                      nullptr, 4, nullptr, nullptr, nullptr, nullptr),
            cudaErrorNotSupported);
  EXPECT_EQ(cuda::LaunchRouterCluster(nullptr, nullptr, kEps, nullptr, nullptr, 9, 2880, 128,
                                      nullptr, 4, nullptr, nullptr, nullptr, nullptr),
            cudaErrorNotSupported);
}

TEST_F(OpsCudaTest, BadArgumentsAreRefused) {
  float* y = nullptr;
  EXPECT_EQ(cuda::LaunchLinear(nullptr, nullptr, nullptr, nullptr, 1, 2880, 128, false, y, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(cuda::LaunchRouterTopK(nullptr, 1, 128, 4, nullptr, nullptr, nullptr),
            cudaErrorInvalidValue);
}

}  // namespace
}  // namespace flotilla::kernels
