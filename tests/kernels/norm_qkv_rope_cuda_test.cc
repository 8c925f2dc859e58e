// LaunchNormQkvRope (input RMSNorm + QKV projection + RoPE + paged KV write in
// one launch) against the unfused sequence it replaces, LaunchAddRmsNorm +
// LaunchLinear + LaunchRopeKvWrite on the checkpoint's row order (each of
// which has its own CPU-reference test), at the gpt-oss-120b attention shape
// (hidden 2880, 64 q heads, 8 kv heads, head_dim 64) and at odd small shapes.
// The unfused sequence on weights in QkvRowOrder::kRopePairs order (the
// engine's large-batch path) must give the checkpoint-order results bit for
// bit.
//
// Tolerances (q, k and v are bf16): both paths round the normed activations
// to bf16 from the same products and run the same mma order; they differ only
// in the summation order of the sum of squares, so the per-token 1/rms may
// differ in its last bit, which can move a normed activation by one bf16 ulp
// now and then. Each output must be within 2 bf16 ulps of the reference plus
// 1e-3 of the largest |reference|, and at least 90% of the outputs must be
// bit-identical. Cache slots that are not written (slot -1 or beyond the
// cache) keep their sentinel on both paths.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common/bf16.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/ops.h"
#include "tests/kernels/cuda_test_util.h"

namespace flotilla::kernels {
namespace {

class NormQkvRopeCudaTest : public CudaTest {};

constexpr uint16_t kSentinel = 0x7FC1;  // a NaN no kernel writes

// got vs want (bf16 bit patterns), the sentinel only where want has it.
void ExpectNear(const std::vector<uint16_t>& got, const std::vector<uint16_t>& want,
                const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double big = 0;
  for (uint16_t w : want) {
    if (w != kSentinel) big = std::max(big, double(std::fabs(Bf16ToFloat(w))));
  }
  size_t exact = 0, bad = 0, first = 0, values = 0;
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (want[i] == kSentinel || got[i] == kSentinel) {
      if (got[i] != want[i] && bad++ == 0) first = i;
      continue;
    }
    ++values;
    if (got[i] == want[i]) {
      ++exact;
      continue;
    }
    const float g = Bf16ToFloat(got[i]), w = Bf16ToFloat(want[i]);
    const double err = std::fabs(double(g) - w);
    worst = std::max(worst, err);
    if (!(err <= 2.0 * Bf16Ulp(w) + 1e-3 * big) && bad++ == 0) first = i;
  }
  EXPECT_EQ(bad, 0u) << what << ": first bad index " << first << " got "
                     << Bf16ToFloat(got[first]) << " want " << Bf16ToFloat(want[first]);
  EXPECT_GE(double(exact), 0.9 * double(values)) << what << ": too few bit-identical values";
  std::printf("[ %s ] %zu values, %zu bit-identical, max |diff| %.3g (max |ref| %.3g)\n",
              what.c_str(), values, exact, worst, big);
}

struct Shape {
  int hidden, q_heads, kv_heads, head_dim;
};

void RunCase(const Shape& s, int T, uint32_t seed) {
  const int H = s.hidden, NH = s.q_heads, NKV = s.kv_heads, D = s.head_dim;
  const int out = (NH + 2 * NKV) * D;
  const std::string what = "H " + std::to_string(H) + " NH " + std::to_string(NH) + " NKV " +
                           std::to_string(NKV) + " D " + std::to_string(D) + " T " +
                           std::to_string(T);
  SCOPED_TRACE(what);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  // Residual rows of different scales, with a few large entries.
  std::vector<float> x(size_t(T) * H);
  for (int t = 0; t < T; ++t) {
    const float scale = 0.5f + 2.0f * t;
    for (int i = 0; i < H; ++i) x[size_t(t) * H + i] = scale * u(rng) * (i % 97 == 5 ? 20.0f : 1.0f);
  }
  std::vector<uint16_t> norm_w(H), w(size_t(out) * H), b(out);
  for (auto& v : norm_w) v = FloatToBf16(1.0f + 0.3f * u(rng));
  const float ws = std::sqrt(3.0f / H);
  for (auto& v : w) v = FloatToBf16(ws * u(rng));
  for (auto& v : b) v = FloatToBf16(0.5f * u(rng));
  // The same projection in kRopePairs order.
  std::vector<uint16_t> wp(w.size()), bp(b.size());
  for (int r = 0; r < out; ++r) {
    const int to = cuda::QkvRopePairsRow(r, NH, NKV, D);
    std::copy(w.begin() + size_t(r) * H, w.begin() + size_t(r + 1) * H, wp.begin() + size_t(to) * H);
    bp[to] = b[r];
  }
  cpu::YarnParams yp;
  yp.head_dim = D;
  const std::vector<float> inv_freq = cpu::YarnInvFreq(yp);
  const float scaling = cpu::YarnAttentionScaling(yp.factor);
  const float eps = 1e-5f;
  // Paged cache: slots shuffled over the blocks, one token not stored (-1)
  // and, with 3 tokens or more, one beyond the cache (not stored either).
  const int bs = 16, blocks = 2 * ((T + bs - 1) / bs) + 1;
  const int cache_slots = blocks * bs;
  std::vector<int32_t> all(cache_slots);
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), rng);
  std::vector<int32_t> pos(T), slots(T);
  for (int t = 0; t < T; ++t) {
    pos[t] = t == 0 ? 131071 : static_cast<int32_t>(rng() % 131072);
    slots[t] = all[t];
  }
  if (T >= 2) slots[1] = -1;
  if (T >= 3) slots[2] = cache_slots + 5;
  const size_t cache_elems = size_t(blocks) * NKV * bs * D;
  const std::vector<uint16_t> sentinel(cache_elems, kSentinel);

  Dev<float> dx(x), dinv(inv_freq);
  Dev<uint16_t> dnw(norm_w), dw(w), db(b), dwp(wp), dbp(bp);
  Dev<int32_t> dpos(pos), dslots(slots);
  cuda::LinearContext* ctx = nullptr;
  ASSERT_EQ(cuda::CreateLinearContext(&ctx), cudaSuccess);

  // Unfused, checkpoint order (the reference) and kRopePairs order.
  auto unfused = [&](const uint16_t* wm, const uint16_t* bv, cuda::QkvRowOrder order,
                     std::vector<uint16_t>* q, std::vector<uint16_t>* k, std::vector<uint16_t>* v) {
    Dev<float> xc(x);
    Dev<uint16_t> t(size_t(T) * H), dq(size_t(T) * NH * D), dk(sentinel), dv(sentinel);
    Dev<float> qkv(size_t(T) * out);
    cuda::PagedKvLayer cache{dk.p, dv.p, blocks, bs, NKV, D};
    ASSERT_EQ(cuda::LaunchAddRmsNorm(xc.p, nullptr, dnw.p, T, H, eps, t.p, nullptr), cudaSuccess);
    ASSERT_EQ(cuda::LaunchLinear(ctx, t.p, wm, bv, T, H, out, false, qkv.p, nullptr), cudaSuccess);
    ASSERT_EQ(cuda::LaunchRopeKvWrite(qkv.p, dpos.p, dslots.p, T, NH, dinv.p, scaling, cache, dq.p,
                                      nullptr, order),
              cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    *q = dq.Get(), *k = dk.Get(), *v = dv.Get();
  };
  std::vector<uint16_t> rq, rk, rv, pq, pk, pv;
  unfused(dw.p, db.p, cuda::QkvRowOrder::kCheckpoint, &rq, &rk, &rv);
  unfused(dwp.p, dbp.p, cuda::QkvRowOrder::kRopePairs, &pq, &pk, &pv);
  EXPECT_EQ(pq, rq) << "unfused q, kRopePairs order";
  EXPECT_EQ(pk, rk) << "unfused k cache, kRopePairs order";
  EXPECT_EQ(pv, rv) << "unfused v cache, kRopePairs order";

  // Fused, launched twice on a stream the second time inside a graph (the
  // engine's decode path).
  ASSERT_TRUE(cuda::NormQkvRopeSupported(T, H, D));
  // One fused launch on `stream` writing q into `q` and k, v into `kv`.
  auto launch_fused = [&](uint16_t* q, cuda::PagedKvLayer kv, cudaStream_t stream = nullptr,
                          const cuda::NormQkvRopeTuning& tuning = cuda::NormQkvRopeTuning{}) {
    return cuda::LaunchNormQkvRope(dx.p, dnw.p, eps, dwp.p, dbp.p, T, H, NH, dpos.p, dslots.p,
                                   dinv.p, scaling, kv, q, stream, tuning);
  };
  Dev<uint16_t> fq(size_t(T) * NH * D), fk(sentinel), fv(sentinel);
  cuda::PagedKvLayer cache{fk.p, fv.p, blocks, bs, NKV, D};
  ASSERT_EQ(launch_fused(fq.p, cache), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ExpectNear(fq.Get(), rq, what + " q");
  ExpectNear(fk.Get(), rk, what + " k cache");
  ExpectNear(fv.Get(), rv, what + " v cache");
  EXPECT_EQ(dx.Get(), x) << "the residual is read only";

  // The ways of streaming the weights change nothing in the results.
  for (int variant = 0; variant < 16; ++variant) {
    cuda::NormQkvRopeTuning tuning;
    tuning.l2_prefetch = (variant & 1) != 0;
    tuning.early_loads = (variant & 2) != 0;
    tuning.late_dependents = (variant & 4) != 0;
    tuning.stage_weights = (variant & 8) != 0;
    Dev<uint16_t> tq(size_t(T) * NH * D), tk(sentinel), tv(sentinel);
    ASSERT_EQ(launch_fused(tq.p, {tk.p, tv.p, blocks, bs, NKV, D}, nullptr, tuning), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(tq.Get(), fq.Get()) << "tuning variant " << variant;
    EXPECT_EQ(tk.Get(), fk.Get()) << "tuning variant " << variant;
    EXPECT_EQ(tv.Get(), fv.Get()) << "tuning variant " << variant;
  }

  Dev<uint16_t> gq(size_t(T) * NH * D), gk(sentinel), gv(sentinel);
  cuda::PagedKvLayer gcache{gk.p, gv.p, blocks, bs, NKV, D};
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  const cudaError_t launched = launch_fused(gq.p, gcache, stream);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_EQ(launched, cudaSuccess);
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_EQ(gq.Get(), fq.Get()) << "graph replay";
  EXPECT_EQ(gk.Get(), fk.Get()) << "graph replay";
  EXPECT_EQ(gv.Get(), fv.Get()) << "graph replay";
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
  cuda::DestroyLinearContext(ctx);
}

TEST_F(NormQkvRopeCudaTest, MatchesTheUnfusedSequenceAtGptOssShapes) {
  for (int T : {1, 2, 3, 8}) RunCase({2880, 64, 8, 64}, T, 100 + T);
}

TEST_F(NormQkvRopeCudaTest, MatchesTheUnfusedSequenceAtOddShapes) {
  // head_dim 10: 16-row tiles straddle heads; 40 rows end mid-tile.
  for (int T : {1, 5, 8}) RunCase({64, 2, 1, 10}, T, 200 + T);
  // The test checkpoints' shapes, and head_dim 128.
  RunCase({96, 4, 2, 32}, 7, 301);
  RunCase({64, 4, 2, 16}, 2, 302);
  RunCase({256, 4, 1, 128}, 8, 303);
}

TEST(NormQkvRopeRows, RopePairsRowsArePairsWithinEachHead) {
  // q: rows of head 1 of head_dim 8; k likewise; v unchanged.
  const int NH = 2, NKV = 1, D = 8;
  const int want_q[8] = {8, 10, 12, 14, 9, 11, 13, 15};
  for (int j = 0; j < D; ++j) EXPECT_EQ(cuda::QkvRopePairsRow(D + j, NH, NKV, D), want_q[j]);
  for (int j = 0; j < D; ++j) {
    EXPECT_EQ(cuda::QkvRopePairsRow(NH * D + j, NH, NKV, D), want_q[j] - D + NH * D);
    EXPECT_EQ(cuda::QkvRopePairsRow((NH + NKV) * D + j, NH, NKV, D), (NH + NKV) * D + j);
  }
}

TEST_F(NormQkvRopeCudaTest, RejectsWhatItCannotRun) {
  cuda::PagedKvLayer cache{nullptr, nullptr, 0, 16, 1, 64};
  float* x = nullptr;
  uint16_t* p = nullptr;
  ASSERT_EQ(cudaMalloc(&x, 4096), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&p, 4096), cudaSuccess);
  const int32_t* ip = reinterpret_cast<const int32_t*>(p);
  const float* fp = x;
  EXPECT_FALSE(cuda::NormQkvRopeSupported(9, 2880, 64));   // too many tokens
  EXPECT_FALSE(cuda::NormQkvRopeSupported(1, 2880 + 8, 64));  // hidden % 32
  EXPECT_FALSE(cuda::NormQkvRopeSupported(1, 2880, 63));   // odd head_dim
  EXPECT_FALSE(cuda::NormQkvRopeSupported(1, 2880, 258));  // head_dim > 256
  EXPECT_TRUE(cuda::NormQkvRopeSupported(8, 2880, 256));
  EXPECT_EQ(cuda::LaunchNormQkvRope(x, p, 1e-5f, p, p, 9, 2880, 64, ip, nullptr, fp, 1.0f, cache,
                                    p, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(cuda::LaunchNormQkvRope(nullptr, p, 1e-5f, p, p, 1, 2880, 64, ip, nullptr, fp, 1.0f,
                                    cache, p, nullptr),
            cudaErrorInvalidValue);
  // Slots given but no cache.
  EXPECT_EQ(cuda::LaunchNormQkvRope(x, p, 1e-5f, p, p, 1, 2880, 64, ip, ip, fp, 1.0f, cache, p,
                                    nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(cuda::LaunchNormQkvRope(x, p, 1e-5f, p, p, 0, 2880, 64, ip, nullptr, fp, 1.0f, cache,
                                    p, nullptr),
            cudaSuccess);
  cudaFree(x);
  cudaFree(p);
}

}  // namespace
}  // namespace flotilla::kernels
