// Each CPU op against a plain reference written here from MODEL.md, in double.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "common/bf16.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/thread_pool.h"

namespace flotilla::kernels::cpu {
namespace {

std::vector<float> RandomFloats(size_t n, uint32_t seed, float lo = -1, float hi = 1) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

std::vector<uint16_t> RandomBf16(size_t n, uint32_t seed, float lo = -1, float hi = 1) {
  std::vector<float> f = RandomFloats(n, seed, lo, hi);
  std::vector<uint16_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = FloatToBf16(f[i]);
  return v;
}

void ExpectClose(const std::vector<float>& got, const std::vector<double>& want, double tol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], tol * (1 + std::abs(want[i]))) << "at " << i;
  }
}

TEST(ThreadPool, CoversEveryIndexOnce) {
  ThreadPool pool(4);
  for (int64_t n : {1, 3, 7, 100, 1001}) {
    std::vector<int> hits(n, 0);
    pool.ParallelFor(n, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) ++hits[i];
    });
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i], 1) << "n=" << n << " i=" << i;
  }
}

TEST(CpuOps, EmbeddingGatherCopiesRows) {
  const int64_t V = 10, H = 6, stride = 8;
  std::vector<uint16_t> table = RandomBf16(V * stride, 1);
  std::vector<int32_t> ids = {3, 0, 9, 3};
  std::vector<float> out(ids.size() * H);
  EmbeddingGather(table.data(), stride, H, ids.data(), ids.size(), out.data());
  for (size_t i = 0; i < ids.size(); ++i) {
    for (int64_t c = 0; c < H; ++c) {
      EXPECT_EQ(out[i * H + c], Bf16ToFloat(table[ids[i] * stride + c]));
    }
  }
}

TEST(CpuOps, RmsNormMatchesReference) {
  const int64_t rows = 3, H = 67;
  std::vector<float> x = RandomFloats(rows * H, 2, -3, 3);
  std::vector<uint16_t> w = RandomBf16(H, 3, 0.5, 1.5);
  std::vector<float> out(rows * H);
  RmsNorm(x.data(), w.data(), rows, H, 1e-5f, out.data());
  std::vector<double> want(rows * H);
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t c = 0; c < H; ++c) ss += double(x[r * H + c]) * x[r * H + c];
    double inv = 1.0 / std::sqrt(ss / H + 1e-5);
    for (int64_t c = 0; c < H; ++c) want[r * H + c] = x[r * H + c] * inv * Bf16ToFloat(w[c]);
  }
  ExpectClose(out, want, 1e-5);
}

TEST(CpuOps, LinearBf16MatchesReferenceForManyShapes) {
  ThreadPool pool(3);
  for (int64_t rows : {1, 2, 9, 17}) {
    for (int64_t in : {16, 40, 96}) {
      const int64_t out_f = 37, stride = in + 5;
      std::vector<float> x = RandomFloats(rows * in, 4);
      std::vector<uint16_t> w = RandomBf16(out_f * stride, 5);
      std::vector<uint16_t> b = RandomBf16(out_f, 6);
      for (bool with_bias : {false, true}) {
        std::vector<float> y(rows * out_f);
        LinearBf16(&pool, x.data(), rows, in, w.data(), stride, out_f,
                   with_bias ? b.data() : nullptr, y.data());
        std::vector<double> want(rows * out_f);
        for (int64_t t = 0; t < rows; ++t) {
          for (int64_t o = 0; o < out_f; ++o) {
            double s = with_bias ? Bf16ToFloat(b[o]) : 0.0;
            for (int64_t i = 0; i < in; ++i) s += double(x[t * in + i]) * Bf16ToFloat(w[o * stride + i]);
            want[t * out_f + o] = s;
          }
        }
        ExpectClose(y, want, 1e-5);
      }
    }
  }
}

// FP4 E2M1 written out from its definition: sign, 2 exponent bits, 1 mantissa bit.
double Fp4Reference(int nibble) {
  const int sign = nibble >> 3, exp = (nibble >> 1) & 3, man = nibble & 1;
  double mag = exp == 0 ? 0.5 * man : std::ldexp(1.0 + 0.5 * man, exp - 1);
  return sign ? -mag : mag;
}

TEST(CpuOps, Fp4TableFollowsE2M1) {
  for (int n = 0; n < 16; ++n) EXPECT_EQ(Fp4Value(n), Fp4Reference(n)) << n;
  EXPECT_EQ(Mxfp4Scale(127), 1.0f);
  EXPECT_EQ(Mxfp4Scale(130), 8.0f);
  EXPECT_EQ(Mxfp4Scale(120), 1.0f / 128);
}

TEST(CpuOps, LinearMxfp4MatchesDequantisedReference) {
  ThreadPool pool(2);
  std::mt19937 rng(7);
  for (int64_t rows : {1, 4, 11}) {
    const int64_t in = 96, out_f = 21, nb = in / 32;
    std::vector<uint8_t> blocks(out_f * nb * 16), scales(out_f * nb);
    for (auto& b : blocks) b = static_cast<uint8_t>(rng());
    for (auto& s : scales) s = static_cast<uint8_t>(120 + rng() % 10);
    std::vector<float> x = RandomFloats(rows * in, 8);
    std::vector<uint16_t> bias = RandomBf16(out_f, 9);
    std::vector<float> y(rows * out_f);
    LinearMxfp4(&pool, x.data(), rows, in, blocks.data(), scales.data(), out_f, bias.data(),
                y.data());
    // Expand the whole matrix (fine in a test) and multiply.
    std::vector<double> w(out_f * in);
    for (int64_t o = 0; o < out_f; ++o) {
      for (int64_t i = 0; i < in; ++i) {
        const uint8_t byte = blocks[(o * nb + i / 32) * 16 + (i % 32) / 2];
        const int nibble = (i % 2 == 0) ? (byte & 15) : (byte >> 4);
        w[o * in + i] = Fp4Reference(nibble) * std::pow(2.0, scales[o * nb + i / 32] - 127.0);
      }
    }
    std::vector<double> want(rows * out_f);
    for (int64_t t = 0; t < rows; ++t) {
      for (int64_t o = 0; o < out_f; ++o) {
        double s = Bf16ToFloat(bias[o]);
        for (int64_t i = 0; i < in; ++i) s += x[t * in + i] * w[o * in + i];
        want[t * out_f + o] = s;
      }
    }
    ExpectClose(y, want, 1e-5);
  }
}

TEST(CpuOps, SwigluClampsGateAndUp) {
  const int64_t rows = 2, I = 5;
  std::vector<float> gu = RandomFloats(rows * 2 * I, 10, -12, 12);
  gu[0] = 9.0f;   // gate above the limit
  gu[1] = -9.0f;  // up below -limit
  std::vector<float> out(rows * I);
  SwigluClamped(gu.data(), rows, I, 7.0f, 1.702f, out.data());
  std::vector<double> want(rows * I);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < I; ++j) {
      double gate = std::min<double>(gu[r * 2 * I + 2 * j], 7.0);
      double up = std::clamp<double>(gu[r * 2 * I + 2 * j + 1], -7.0, 7.0);
      want[r * I + j] = gate / (1 + std::exp(-1.702 * gate)) * (up + 1);
    }
  }
  ExpectClose(out, want, 1e-5);
}

std::vector<double> YarnReference(double theta, int D, double factor, double L0, double bf,
                                  double bs) {
  const double low = (D / 2.0) * std::log(L0 / (bf * 2 * M_PI)) / std::log(theta);
  const double high = (D / 2.0) * std::log(L0 / (bs * 2 * M_PI)) / std::log(theta);
  std::vector<double> inv(D / 2);
  for (int j = 0; j < D / 2; ++j) {
    double freq = std::pow(theta, 2.0 * j / D);
    double ramp = std::clamp((j - low) / (high - low), 0.0, 1.0);
    double mask = 1 - ramp;
    inv[j] = (1 / (factor * freq)) * (1 - mask) + (1 / freq) * mask;
  }
  return inv;
}

TEST(CpuOps, YarnInvFreqFollowsModelMd) {
  for (int D : {16, 64}) {
    YarnParams p;
    p.head_dim = D;
    std::vector<float> got = YarnInvFreq(p);
    std::vector<double> want = YarnReference(150000, D, 32, 4096, 32, 1);
    ExpectClose(got, want, 2e-6);
  }
  YarnParams p;
  std::vector<float> inv = YarnInvFreq(p);
  EXPECT_FLOAT_EQ(inv[0], 1.0f);  // below `low`: pure extrapolation
  EXPECT_NEAR(inv[31], 1.0 / (32 * std::pow(150000.0, 62.0 / 64)), 1e-12);  // above `high`
  EXPECT_NEAR(YarnAttentionScaling(32), 0.1 * std::log(32.0) + 1, 1e-7);
  EXPECT_EQ(YarnAttentionScaling(1), 1.0f);
}

TEST(CpuOps, RopeRotatesHalves) {
  const int64_t T = 3, heads = 2, D = 16;
  std::vector<float> x = RandomFloats(T * heads * D, 11);
  std::vector<float> orig = x;
  std::vector<int64_t> pos = {0, 5, 1000};
  YarnParams p;
  p.head_dim = D;
  std::vector<float> inv = YarnInvFreq(p);
  const float scaling = YarnAttentionScaling(32);
  ApplyRope(x.data(), T, heads, D, pos.data(), inv.data(), scaling);
  std::vector<double> want(x.size());
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      const float* v = &orig[(t * heads + h) * D];
      for (int64_t j = 0; j < D / 2; ++j) {
        double a = double(pos[t]) * inv[j];
        double c = std::cos(a) * scaling, s = std::sin(a) * scaling;
        want[(t * heads + h) * D + j] = v[j] * c - v[j + D / 2] * s;
        want[(t * heads + h) * D + j + D / 2] = v[j + D / 2] * c + v[j] * s;
      }
    }
  }
  ExpectClose(x, want, 2e-4);  // f32 angle at position 1000
}

// Naive attention over contiguous K/V of all positions [P, kvh, D].
std::vector<double> AttentionReference(const std::vector<float>& q, const std::vector<float>& k,
                                       const std::vector<float>& v, int64_t start, int64_t n,
                                       int64_t qh, int64_t kvh, int64_t D,
                                       const std::vector<float>& sinks, int64_t window) {
  std::vector<double> out(n * qh * D, 0.0);
  for (int64_t t = 0; t < n; ++t) {
    const int64_t i = start + t;
    for (int64_t h = 0; h < qh; ++h) {
      const int64_t g = h / (qh / kvh);
      std::vector<double> logits;
      std::vector<int64_t> keys;
      for (int64_t j = 0; j <= i; ++j) {
        if (window > 0 && j <= i - window) continue;
        double s = 0;
        for (int64_t d = 0; d < D; ++d) s += double(q[(t * qh + h) * D + d]) * k[(j * kvh + g) * D + d];
        logits.push_back(s / std::sqrt(double(D)));
        keys.push_back(j);
      }
      double mx = sinks[h];
      for (double l : logits) mx = std::max(mx, l);
      double sum = std::exp(sinks[h] - mx);
      for (double l : logits) sum += std::exp(l - mx);
      for (size_t m = 0; m < keys.size(); ++m) {
        double p = std::exp(logits[m] - mx) / sum;
        for (int64_t d = 0; d < D; ++d) out[(t * qh + h) * D + d] += p * v[(keys[m] * kvh + g) * D + d];
      }
    }
  }
  return out;
}

TEST(CpuOps, AttentionWithSinksWindowAndPagedCacheMatchesReference) {
  ThreadPool pool(3);
  const int64_t qh = 4, kvh = 2, D = 8, bs = 4;
  for (int64_t window : {0, 5}) {
    // Two sequences in one call: one prefill chunk after a cached prefix, one decode.
    struct Case { int64_t start, n; };
    std::vector<Case> cases = {{7, 6}, {13, 1}};
    std::vector<std::vector<float>> ks, vs, qs, outs;
    std::vector<std::vector<float>> arenas;
    std::vector<std::vector<int32_t>> tables;
    std::vector<AttentionItem> items;
    std::vector<float> sinks = RandomFloats(qh, 20, -1, 1);
    for (size_t c = 0; c < cases.size(); ++c) {
      const int64_t P = cases[c].start + cases[c].n;
      ks.push_back(RandomFloats(P * kvh * D, 30 + c));
      vs.push_back(RandomFloats(P * kvh * D, 40 + c));
      qs.push_back(RandomFloats(cases[c].n * qh * D, 50 + c, -3, 3));
      outs.emplace_back(cases[c].n * qh * D);
      // Cached prefix in shuffled physical blocks.
      const int64_t nblocks = (cases[c].start + bs - 1) / bs;
      const int64_t block_floats = 2 * bs * kvh * D;
      std::vector<int32_t> table(nblocks);
      std::iota(table.begin(), table.end(), 0);
      std::reverse(table.begin(), table.end());
      std::vector<float> arena(nblocks * block_floats, std::nanf(""));
      for (int64_t j = 0; j < cases[c].start; ++j) {
        float* blk = &arena[table[j / bs] * block_floats];
        std::copy_n(&ks[c][j * kvh * D], kvh * D, blk + (j % bs) * kvh * D);
        std::copy_n(&vs[c][j * kvh * D], kvh * D, blk + block_floats / 2 + (j % bs) * kvh * D);
      }
      arenas.push_back(std::move(arena));
      tables.push_back(std::move(table));
    }
    for (size_t c = 0; c < cases.size(); ++c) {
      AttentionItem it;
      it.cache = {arenas[c].data(), tables[c].data(), bs, 2 * bs * kvh * D, 0, cases[c].start};
      it.q = qs[c].data();
      it.k_new = &ks[c][cases[c].start * kvh * D];
      it.v_new = &vs[c][cases[c].start * kvh * D];
      it.num_new = cases[c].n;
      it.start_pos = cases[c].start;
      it.out = outs[c].data();
      items.push_back(it);
    }
    // Both items share one arena pointer in real use; here each has its own,
    // which the kernel must not care about.
    ASSERT_TRUE(Attention(&pool, items.data(), items.size(), qh, kvh, D, sinks.data(), window,
                          1.0f / std::sqrt(float(D))));
    for (size_t c = 0; c < cases.size(); ++c) {
      ExpectClose(outs[c], AttentionReference(qs[c], ks[c], vs[c], cases[c].start, cases[c].n, qh,
                                              kvh, D, sinks, window),
                  1e-5);
    }
  }
}

TEST(CpuOps, AttentionRefusesWhenTheCacheLacksAPosition) {
  const int64_t qh = 2, kvh = 1, D = 4, bs = 4;
  std::vector<float> arena(2 * bs * kvh * D * 2, 0.0f);
  std::vector<int32_t> table = {-1, 1};  // block 0 freed
  std::vector<float> q(qh * D, 1), k(kvh * D, 1), v(kvh * D, 1), out(qh * D), sinks(qh, 0);
  AttentionItem it;
  it.cache = {arena.data(), table.data(), bs, 2 * bs * kvh * D, 4, 8};
  it.q = q.data();
  it.k_new = k.data();
  it.v_new = v.data();
  it.num_new = 1;
  it.start_pos = 8;
  it.out = out.data();
  EXPECT_FALSE(Attention(nullptr, &it, 1, qh, kvh, D, sinks.data(), 0, 0.5f));  // full needs 0..7
  EXPECT_TRUE(Attention(nullptr, &it, 1, qh, kvh, D, sinks.data(), 5, 0.5f));   // window needs 4..7
}

TEST(CpuOps, RouterTopKSoftmaxOverTheKOnly) {
  const int64_t E = 8, K = 3;
  std::vector<float> logits = {0.5f, 2.0f, -1.0f, 2.0f, 1.0f, 0.0f, 3.0f, 1.0f,   // ties 1/3 and 4/7
                               1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f};  // all tied
  std::vector<int32_t> idx(2 * K);
  std::vector<float> w(2 * K);
  RouterTopK(logits.data(), 2, E, K, idx.data(), w.data());
  EXPECT_EQ(idx[0], 6);
  EXPECT_EQ(idx[1], 1);
  EXPECT_EQ(idx[2], 3);
  EXPECT_EQ(idx[3], 0);
  EXPECT_EQ(idx[4], 1);
  EXPECT_EQ(idx[5], 2);
  double z = std::exp(3.0) + 2 * std::exp(2.0);
  EXPECT_NEAR(w[0], std::exp(3.0) / z, 1e-6);
  EXPECT_NEAR(w[1], std::exp(2.0) / z, 1e-6);
  EXPECT_NEAR(w[2], std::exp(2.0) / z, 1e-6);
  for (int s = 0; s < K; ++s) EXPECT_NEAR(w[K + s], 1.0 / 3, 1e-6);
}

TEST(CpuOps, DotHandlesTails) {
  for (int64_t n : {0, 1, 15, 16, 33}) {
    std::vector<float> a = RandomFloats(n, 60), b = RandomFloats(n, 61);
    double want = 0;
    for (int64_t i = 0; i < n; ++i) want += double(a[i]) * b[i];
    EXPECT_NEAR(Dot(a.data(), b.data(), n), want, 1e-5);
  }
}

}  // namespace
}  // namespace flotilla::kernels::cpu
