// The CUDA ops at the small, odd shapes of test checkpoints (hidden 64 and 96,
// head_dim 16 and 32, 8 or 16 experts, top-2 or top-4, 1 to 40 tokens), each
// against its CPU reference. The per-family tests cover the real gpt-oss
// shapes; these catch kernels that silently assume them.
//
// Tolerances: every input is bf16-exact on both sides and accumulation is f32,
// so f32 outputs differ only by summation order: 1e-3 * max(1, max |ref|).
// bf16 outputs are compared with the reference rounded to bf16: 1e-2 relative
// (about two bf16 ulps).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "common/bf16.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/attention_generic.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/moe.h"
#include "kernels/cuda/ops.h"
#include "tests/kernels/cuda_test_util.h"

namespace flotilla::kernels {
namespace {

class SmallShapesCudaTest : public CudaTest {};

std::vector<uint16_t> RandomBf16(size_t n, float scale, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = FloatToBf16(u(rng));
  return v;
}

std::vector<float> Widen(const std::vector<uint16_t>& v) {
  std::vector<float> f(v.size());
  for (size_t i = 0; i < v.size(); ++i) f[i] = Bf16ToFloat(v[i]);
  return f;
}

void ExpectClose(const std::vector<float>& got, const std::vector<float>& want, double rel,
                 const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double big = 1;
  for (float w : want) big = std::max(big, double(std::abs(w)));
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!(std::abs(double(got[i]) - want[i]) <= rel * big)) {
      if (bad++ == 0) first = i;
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": first bad index " << first << " got " << got[first]
                     << " want " << want[first] << " (max |want| " << big << ")";
}

TEST_F(SmallShapesCudaTest, LinearMatchesTheCpu) {
  std::mt19937 rng(1);
  cuda::LinearContext* ctx = nullptr;
  ASSERT_EQ(cuda::CreateLinearContext(&ctx), cudaSuccess);
  const int shapes[][2] = {{64, 192}, {96, 256}, {128, 64}, {64, 8}, {96, 16}, {64, 1024}, {96, 160}};
  for (auto [in, out] : shapes) {
    for (int T : {1, 5, 16, 17, 40}) {
      for (bool bias : {false, true}) {
        for (bool acc : {false, true}) {
          const std::string what = "in " + std::to_string(in) + " out " + std::to_string(out) +
                                   " T " + std::to_string(T) + (bias ? " bias" : "") +
                                   (acc ? " accumulate" : "");
          auto x = RandomBf16(size_t(T) * in, 1.0f, rng);
          auto w = RandomBf16(size_t(out) * in, 0.2f, rng);
          auto b = RandomBf16(out, 0.5f, rng);
          std::vector<float> y0(size_t(T) * out);
          for (auto& v : y0) v = std::uniform_real_distribution<float>(-1, 1)(rng);
          std::vector<float> want(size_t(T) * out);
          cpu::LinearBf16(nullptr, Widen(x).data(), T, in, w.data(), in, out,
                          bias ? b.data() : nullptr, want.data());
          if (acc) {
            for (size_t i = 0; i < want.size(); ++i) want[i] += y0[i];
          }
          Dev<uint16_t> dx(x), dw(w), db(b);
          Dev<float> dy(y0);
          ASSERT_EQ(cuda::LaunchLinear(ctx, dx.p, dw.p, bias ? db.p : nullptr, T, in, out, acc,
                                       dy.p, nullptr),
                    cudaSuccess)
              << what;
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what;
          ExpectClose(dy.Get(), want, 1e-3, what);
        }
      }
    }
  }
  cuda::DestroyLinearContext(ctx);
}

TEST_F(SmallShapesCudaTest, AddRmsNormAndRowsMatchTheCpu) {
  std::mt19937 rng(2);
  for (int H : {64, 96}) {
    for (int T : {1, 7, 40}) {
      const std::string what = "H " + std::to_string(H) + " T " + std::to_string(T);
      std::vector<float> x(size_t(T) * H), add(size_t(T) * H);
      for (auto& v : x) v = std::uniform_real_distribution<float>(-3, 3)(rng);
      for (auto& v : add) v = std::uniform_real_distribution<float>(-1, 1)(rng);
      auto w = RandomBf16(H, 1.5f, rng);
      std::vector<float> sum(x.size());
      for (size_t i = 0; i < x.size(); ++i) sum[i] = x[i] + add[i];
      std::vector<float> want(x.size());
      cpu::RmsNorm(sum.data(), w.data(), T, H, 1e-5f, want.data());
      for (auto& v : want) v = Bf16ToFloat(FloatToBf16(v));
      Dev<float> dx(x), dadd(add);
      Dev<uint16_t> dw(w), dout(size_t(T) * H);
      ASSERT_EQ(cuda::LaunchAddRmsNorm(dx.p, dadd.p, dw.p, T, H, 1e-5f, dout.p, nullptr), cudaSuccess);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      ExpectClose(Widen(dout.Get()), want, 1e-2, what);
      ExpectClose(dx.Get(), sum, 1e-6, what + " residual");
      // Rows in reverse order.
      std::vector<int32_t> rows;
      for (int t = T - 1; t >= 0; --t) rows.push_back(t);
      Dev<int32_t> drows(rows);
      Dev<uint16_t> dsel(size_t(T) * H);
      ASSERT_EQ(cuda::LaunchRmsNormRows(dx.p, drows.p, T, dw.p, H, 1e-5f, dsel.p, nullptr), cudaSuccess);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      std::vector<float> want_rows;
      for (int r : rows) want_rows.insert(want_rows.end(), want.begin() + size_t(r) * H, want.begin() + size_t(r + 1) * H);
      ExpectClose(Widen(dsel.Get()), want_rows, 1e-2, what + " rows");
    }
  }
}

TEST_F(SmallShapesCudaTest, RopeKvWriteMatchesTheCpu) {
  std::mt19937 rng(3);
  const int cases[][3] = {{16, 8, 2}, {32, 4, 2}, {64, 8, 1}};  // head_dim, q heads, kv heads
  for (auto [D, NH, NKV] : cases) {
    const std::string what = "D " + std::to_string(D) + " NH " + std::to_string(NH);
    cpu::YarnParams yp;
    yp.head_dim = D;
    const std::vector<float> inv_freq = cpu::YarnInvFreq(yp);
    const float scaling = cpu::YarnAttentionScaling(yp.factor);
    const int T = 21, bs = 16, blocks = 4;
    std::vector<float> qkv(size_t(T) * (NH + 2 * NKV) * D);
    for (auto& v : qkv) v = std::uniform_real_distribution<float>(-2, 2)(rng);
    std::vector<int32_t> pos(T), slots(T);
    std::vector<int64_t> pos64(T);
    for (int t = 0; t < T; ++t) {
      pos[t] = pos64[t] = 3 * t + 5;
      slots[t] = t == 4 ? -1 : (blocks - 1 - t / bs) * bs + t % bs;  // blocks used high to low
    }
    Dev<float> dqkv(qkv), dinv(inv_freq);
    Dev<int32_t> dpos(pos), dslots(slots);
    Dev<uint16_t> dq(size_t(T) * NH * D), dk(size_t(blocks) * NKV * bs * D),
        dv(size_t(blocks) * NKV * bs * D);
    cuda::PagedKvLayer cache{dk.p, dv.p, blocks, bs, NKV, D};
    ASSERT_EQ(cuda::LaunchRopeKvWrite(dqkv.p, dpos.p, dslots.p, T, NH, dinv.p, scaling, cache, dq.p,
                                      nullptr),
              cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<float> q(size_t(T) * NH * D), k(size_t(T) * NKV * D), v(size_t(T) * NKV * D);
    for (int t = 0; t < T; ++t) {
      const float* src = &qkv[size_t(t) * (NH + 2 * NKV) * D];
      std::copy(src, src + NH * D, &q[size_t(t) * NH * D]);
      std::copy(src + NH * D, src + (NH + NKV) * D, &k[size_t(t) * NKV * D]);
      std::copy(src + (NH + NKV) * D, src + (NH + 2 * NKV) * D, &v[size_t(t) * NKV * D]);
    }
    cpu::ApplyRope(q.data(), T, NH, D, pos64.data(), inv_freq.data(), scaling);
    cpu::ApplyRope(k.data(), T, NKV, D, pos64.data(), inv_freq.data(), scaling);
    for (auto& x : q) x = Bf16ToFloat(FloatToBf16(x));
    ExpectClose(Widen(dq.Get()), q, 1e-2, what + " q");
    const std::vector<uint16_t> kc = dk.Get(), vc = dv.Get();
    std::vector<float> got_k, got_v, want_k, want_v;
    for (int t = 0; t < T; ++t) {
      if (slots[t] < 0) continue;
      const int blk = slots[t] / bs, off = slots[t] % bs;
      for (int h = 0; h < NKV; ++h) {
        for (int d = 0; d < D; ++d) {
          const size_t at = ((size_t(blk) * NKV + h) * bs + off) * D + d;
          got_k.push_back(Bf16ToFloat(kc[at]));
          got_v.push_back(Bf16ToFloat(vc[at]));
          want_k.push_back(Bf16ToFloat(FloatToBf16(k[(size_t(t) * NKV + h) * D + d])));
          want_v.push_back(Bf16ToFloat(FloatToBf16(v[(size_t(t) * NKV + h) * D + d])));
        }
      }
    }
    ExpectClose(got_k, want_k, 1e-2, what + " k");
    ExpectClose(got_v, want_v, 1e-2, what + " v");
  }
}

TEST_F(SmallShapesCudaTest, RouterTopKMatchesTheCpu) {
  std::mt19937 rng(4);
  for (auto [E, K] : {std::pair{8, 4}, std::pair{16, 2}, std::pair{32, 4}}) {
    for (int T : {1, 9, 40}) {
      std::vector<float> logits(size_t(T) * E);
      for (auto& v : logits) v = std::uniform_real_distribution<float>(-4, 4)(rng);
      if (T > 1) logits[E + 1] = logits[E + 2];  // a tie
      std::vector<int32_t> want_ids(size_t(T) * K);
      std::vector<float> want_w(size_t(T) * K);
      cpu::RouterTopK(logits.data(), T, E, K, want_ids.data(), want_w.data());
      Dev<float> dl(logits), dw(size_t(T) * K);
      Dev<int32_t> di(size_t(T) * K);
      ASSERT_EQ(cuda::LaunchRouterTopK(dl.p, T, E, K, di.p, dw.p, nullptr), cudaSuccess);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      EXPECT_EQ(di.Get(), want_ids) << "E " << E << " K " << K << " T " << T;
      ExpectClose(dw.Get(), want_w, 1e-5, "router weights");
    }
  }
}

TEST_F(SmallShapesCudaTest, MoeLayerMatchesTheCpu) {
  std::mt19937 rng(5);
  const int cases[][4] = {{8, 64, 64, 4}, {16, 96, 64, 2}, {8, 96, 128, 4}};  // E, H, I, K
  for (auto [E, H, I, K] : cases) {
    cuda::MoeDeviceWeights w;
    ASSERT_EQ(cuda::AllocMoeWeights(E, H, I, &w), cudaSuccess);
    std::uniform_int_distribution<int> byte(0, 255), scale(117, 122);
    std::vector<std::vector<uint8_t>> gub(E), gus(E), db(E), ds(E);
    std::vector<std::vector<uint16_t>> gubias(E), dbias(E);
    for (int e = 0; e < E; ++e) {
      gub[e].resize(size_t(2 * I) * H / 2);
      gus[e].resize(size_t(2 * I) * H / 32);
      db[e].resize(size_t(H) * I / 2);
      ds[e].resize(size_t(H) * I / 32);
      for (auto& b : gub[e]) b = uint8_t(byte(rng));
      for (auto& b : db[e]) b = uint8_t(byte(rng));
      for (auto& b : gus[e]) b = uint8_t(scale(rng));
      for (auto& b : ds[e]) b = uint8_t(scale(rng));
      gubias[e] = RandomBf16(2 * I, 0.1f, rng);
      dbias[e] = RandomBf16(H, 0.1f, rng);
      ASSERT_EQ(cuda::UploadMoeExpert(w, e, gub[e].data(), gus[e].data(), gubias[e].data(),
                                      db[e].data(), ds[e].data(), dbias[e].data(), nullptr),
                cudaSuccess);
    }
    for (int T : {1, 5, 17, 40}) {
      const std::string what = "E " + std::to_string(E) + " H " + std::to_string(H) + " I " +
                               std::to_string(I) + " K " + std::to_string(K) + " T " +
                               std::to_string(T);
      auto x = RandomBf16(size_t(T) * H, 2.0f, rng);
      std::vector<int32_t> ids(size_t(T) * K);
      std::vector<float> tw(size_t(T) * K);
      for (int t = 0; t < T; ++t) {
        std::vector<int> perm(E);
        for (int e = 0; e < E; ++e) perm[e] = e;
        std::shuffle(perm.begin(), perm.end(), rng);
        for (int k = 0; k < K; ++k) {
          ids[size_t(t) * K + k] = perm[k];
          tw[size_t(t) * K + k] = std::uniform_real_distribution<float>(0, 1)(rng);
        }
      }
      std::vector<float> out0(size_t(T) * H);
      for (auto& v : out0) v = std::uniform_real_distribution<float>(-1, 1)(rng);
      std::vector<float> want = out0;
      const std::vector<float> xf = Widen(x);
      std::vector<float> gu(2 * I), act(I), y(H);
      for (int t = 0; t < T; ++t) {
        for (int k = 0; k < K; ++k) {
          const int e = ids[size_t(t) * K + k];
          cpu::LinearMxfp4(nullptr, &xf[size_t(t) * H], 1, H, gub[e].data(), gus[e].data(), 2 * I,
                           gubias[e].data(), gu.data());
          cpu::SwigluClamped(gu.data(), 1, I, 7.0f, 1.702f, act.data());
          cpu::LinearMxfp4(nullptr, act.data(), 1, I, db[e].data(), ds[e].data(), H,
                           dbias[e].data(), y.data());
          for (int h = 0; h < H; ++h) want[size_t(t) * H + h] += tw[size_t(t) * K + k] * y[h];
        }
      }
      Dev<uint16_t> dx(x);
      Dev<int32_t> dids(ids), dinvalid(1);
      Dev<float> dtw(tw), dout(out0);
      const size_t ws = cuda::MoeWorkspaceBytes(w, T, K);
      Dev<uint8_t> dws(ws);
      ASSERT_EQ(cuda::LaunchMoeLayer(w, dx.p, dids.p, dtw.p, T, K, 7.0f, 1.702f, dout.p, dws.p, ws,
                                     dinvalid.p, nullptr),
                cudaSuccess)
          << what;
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what;
      EXPECT_EQ(dinvalid.Get()[0], 0) << what;
      // The GPU may round the SwiGLU output to bf16 before the down projection
      // (tensor cores): allow for that.
      ExpectClose(dout.Get(), want, 1e-2, what);
    }
    cuda::FreeMoeWeights(&w);
  }
}

TEST_F(SmallShapesCudaTest, GenericAttentionMatchesTheCpu) {
  std::mt19937 rng(6);
  const int cases[][4] = {{16, 8, 2, 16}, {32, 4, 2, 8}, {64, 8, 1, 0}};  // D, NH, NKV, window
  for (auto [D, NH, NKV, window] : cases) {
    const int bs = 16, blocks = 16;
    // Two sequences: 30 cached + 7 new, and 1 new token on 45 cached.
    const int len[2] = {37, 46}, nnew[2] = {7, 1};
    auto kc = RandomBf16(size_t(blocks) * NKV * bs * D, 1.0f, rng);
    auto vc = RandomBf16(size_t(blocks) * NKV * bs * D, 1.0f, rng);
    std::vector<int32_t> table = {5, 2, 9, 0, 11, 3, 7, 1};  // 4 blocks each
    std::vector<int32_t> lens = {len[0], len[1]}, qstart = {0, nnew[0], nnew[0] + nnew[1]};
    const int total_q = nnew[0] + nnew[1];
    auto q = RandomBf16(size_t(total_q) * NH * D, 1.0f, rng);
    std::vector<float> sinks(NH);
    for (auto& s : sinks) s = std::uniform_real_distribution<float>(-1, 1)(rng);
    // CPU: a dense f32 cache of the same layout per sequence.
    std::vector<float> want(size_t(total_q) * NH * D);
    const float scale = 1.0f / std::sqrt(float(D));
    for (int b = 0; b < 2; ++b) {
      for (int i = 0; i < nnew[b]; ++i) {
        const int p = len[b] - nnew[b] + i;
        const int first = window > 0 ? std::max(0, p - window + 1) : 0;
        for (int h = 0; h < NH; ++h) {
          const int kvh = h / (NH / NKV);
          const uint16_t* qh = &q[(size_t(qstart[b] + i) * NH + h) * D];
          std::vector<double> s;
          double m = sinks[h];
          for (int j = first; j <= p; ++j) {
            const int blk = table[b * 4 + j / bs];
            const size_t row = ((size_t(blk) * NKV + kvh) * bs + j % bs) * D;
            double dot = 0;
            for (int d = 0; d < D; ++d) dot += Bf16ToFloat(qh[d]) * Bf16ToFloat(kc[row + d]);
            s.push_back(dot * scale);
            m = std::max(m, s.back());
          }
          double z = std::exp(sinks[h] - m);
          for (double v : s) z += std::exp(v - m);
          for (int d = 0; d < D; ++d) {
            double o = 0;
            for (int j = first; j <= p; ++j) {
              const int blk = table[b * 4 + j / bs];
              const size_t row = ((size_t(blk) * NKV + kvh) * bs + j % bs) * D;
              o += std::exp(s[j - first] - m) / z * Bf16ToFloat(vc[row + d]);
            }
            want[(size_t(qstart[b] + i) * NH + h) * D + d] = Bf16ToFloat(FloatToBf16(float(o)));
          }
        }
      }
    }
    Dev<uint16_t> dk(kc), dv(vc), dq(q), dout(size_t(total_q) * NH * D);
    Dev<int32_t> dtable(table), dlens(lens), dqs(qstart);
    Dev<float> dsinks(sinks);
    cuda::PagedKvLayer cache{dk.p, dv.p, blocks, bs, NKV, D};
    cuda::AttentionBatch batch;
    batch.block_tables = dtable.p;
    batch.max_blocks_per_seq = 4;
    batch.seq_lens = dlens.p;
    batch.q_start = dqs.p;
    batch.batch = 2;
    batch.total_q = total_q;
    batch.max_seq_len = 64;
    batch.max_q_per_seq = 7;
    ASSERT_EQ(cuda::LaunchAttentionGeneric(dq.p, cache, batch, NH, dsinks.p, window, scale, dout.p,
                                           nullptr),
              cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    ExpectClose(Widen(dout.Get()), want, 1e-2, "D " + std::to_string(D));
  }
}

}  // namespace
}  // namespace flotilla::kernels
