#include "kernels/cpu/ops.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <numbers>

#include "common/bf16.h"

namespace flotilla::kernels::cpu {
namespace {

constexpr float kFp4Values[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                  -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

// Both nibbles of a byte decoded at once: {low, high}.
struct PairTable {
  std::array<std::array<float, 2>, 256> v;
  PairTable() {
    for (int b = 0; b < 256; ++b) v[b] = {kFp4Values[b & 15], kFp4Values[b >> 4]};
  }
};
const PairTable kPairs;

struct ScaleTable {
  std::array<float, 256> v;
  ScaleTable() {
    for (int s = 0; s < 256; ++s) v[s] = std::ldexp(1.0f, s - 127);
  }
};
const ScaleTable kScales;

// How many token rows share one decoded weight chunk.
constexpr int64_t kTokenTile = 8;

inline float SumLanes(const float* lanes) {
  float s = 0;
  for (int k = 0; k < 16; ++k) s += lanes[k];
  return s;
}

}  // namespace

float Fp4Value(uint8_t nibble) { return kFp4Values[nibble & 15]; }
float Mxfp4Scale(uint8_t scale) { return kScales.v[scale]; }

float Dot(const float* a, const float* b, int64_t n) {
  float lanes[16] = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    for (int k = 0; k < 16; ++k) lanes[k] += a[i + k] * b[i + k];
  }
  float s = SumLanes(lanes);
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

void EmbeddingGather(const uint16_t* table, int64_t row_stride, int64_t hidden,
                     const int32_t* ids, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t* row = table + static_cast<int64_t>(ids[i]) * row_stride;
    float* o = out + i * hidden;
    for (int64_t c = 0; c < hidden; ++c) o[c] = Bf16ToFloat(row[c]);
  }
}

void RmsNorm(const float* x, const uint16_t* weight, int64_t rows, int64_t hidden, float eps,
             float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * hidden;
    float ms = Dot(xr, xr, hidden) / static_cast<float>(hidden);
    float inv = 1.0f / std::sqrt(ms + eps);
    float* o = out + r * hidden;
    for (int64_t c = 0; c < hidden; ++c) o[c] = Bf16ToFloat(weight[c]) * (xr[c] * inv);
  }
}

void LinearBf16(ThreadPool* pool, const float* x, int64_t rows, int64_t in_features,
                const uint16_t* w, int64_t w_stride, int64_t out_features, const uint16_t* bias,
                float* y) {
  ParallelFor(
      pool, out_features,
      [&](int64_t o_begin, int64_t o_end) {
        const int64_t full = in_features / 16 * 16;
        for (int64_t o = o_begin; o < o_end; ++o) {
          const uint16_t* wr = w + o * w_stride;
          const float b = bias != nullptr ? Bf16ToFloat(bias[o]) : 0.0f;
          for (int64_t t0 = 0; t0 < rows; t0 += kTokenTile) {
            const int64_t tn = std::min(kTokenTile, rows - t0);
            float acc[kTokenTile][16] = {};
            for (int64_t i = 0; i < full; i += 16) {
              float wf[16];
              for (int k = 0; k < 16; ++k) wf[k] = Bf16ToFloat(wr[i + k]);
              for (int64_t t = 0; t < tn; ++t) {
                const float* xp = x + (t0 + t) * in_features + i;
                for (int k = 0; k < 16; ++k) acc[t][k] += xp[k] * wf[k];
              }
            }
            for (int64_t t = 0; t < tn; ++t) {
              const float* xr = x + (t0 + t) * in_features;
              float s = SumLanes(acc[t]);
              for (int64_t i = full; i < in_features; ++i) s += xr[i] * Bf16ToFloat(wr[i]);
              y[(t0 + t) * out_features + o] = s + b;
            }
          }
        }
      },
      16);
}

void LinearMxfp4(ThreadPool* pool, const float* x, int64_t rows, int64_t in_features,
                 const uint8_t* blocks, const uint8_t* scales, int64_t out_features,
                 const uint16_t* bias, float* y) {
  const int64_t nb = in_features / 32;
  ParallelFor(
      pool, out_features,
      [&](int64_t o_begin, int64_t o_end) {
        for (int64_t o = o_begin; o < o_end; ++o) {
          const uint8_t* br = blocks + o * nb * 16;
          const uint8_t* sr = scales + o * nb;
          const float b = bias != nullptr ? Bf16ToFloat(bias[o]) : 0.0f;
          for (int64_t t0 = 0; t0 < rows; t0 += kTokenTile) {
            const int64_t tn = std::min(kTokenTile, rows - t0);
            float acc[kTokenTile][16] = {};
            for (int64_t blk = 0; blk < nb; ++blk) {
              // Decode one 32-element block (16 bytes, one scale) into registers.
              const float s = kScales.v[sr[blk]];
              const uint8_t* bytes = br + blk * 16;
              float wf[32];
              for (int j = 0; j < 16; ++j) {
                wf[2 * j] = kPairs.v[bytes[j]][0] * s;
                wf[2 * j + 1] = kPairs.v[bytes[j]][1] * s;
              }
              for (int64_t t = 0; t < tn; ++t) {
                const float* xp = x + (t0 + t) * in_features + blk * 32;
                for (int k = 0; k < 16; ++k) acc[t][k] += xp[k] * wf[k];
                for (int k = 0; k < 16; ++k) acc[t][k] += xp[16 + k] * wf[16 + k];
              }
            }
            for (int64_t t = 0; t < tn; ++t) y[(t0 + t) * out_features + o] = SumLanes(acc[t]) + b;
          }
        }
      },
      16);
}

void SwigluClamped(const float* gate_up, int64_t rows, int64_t intermediate, float limit,
                   float alpha, float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = gate_up + r * 2 * intermediate;
    float* o = out + r * intermediate;
    for (int64_t j = 0; j < intermediate; ++j) {
      float gate = std::min(g[2 * j], limit);
      float up = std::clamp(g[2 * j + 1], -limit, limit);
      float glu = gate * (1.0f / (1.0f + std::exp(-(gate * alpha))));
      o[j] = (up + 1.0f) * glu;
    }
  }
}

std::vector<float> YarnInvFreq(const YarnParams& p) {
  const int half = p.head_dim / 2;
  const double two_pi = 2.0 * std::numbers::pi;
  auto correction_dim = [&](double rotations) {
    return (p.head_dim * std::log(p.original_max_position_embeddings / (rotations * two_pi))) /
           (2.0 * std::log(p.theta));
  };
  double low = correction_dim(p.beta_fast);
  double high = correction_dim(p.beta_slow);
  if (p.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(p.head_dim - 1));
  if (low == high) high += 0.001;
  const float base = static_cast<float>(p.theta);
  const float factor = static_cast<float>(p.factor);
  const float lowf = static_cast<float>(low);
  const float span = static_cast<float>(high - low);
  std::vector<float> inv_freq(half);
  for (int j = 0; j < half; ++j) {
    float pos_freq = std::pow(base, static_cast<float>(2 * j) / static_cast<float>(p.head_dim));
    float extrapolation = 1.0f / pos_freq;
    float interpolation = 1.0f / (factor * pos_freq);
    float ramp = std::clamp((static_cast<float>(j) - lowf) / span, 0.0f, 1.0f);
    float extrapolation_factor = 1.0f - ramp;
    inv_freq[j] =
        interpolation * (1.0f - extrapolation_factor) + extrapolation * extrapolation_factor;
  }
  return inv_freq;
}

float YarnAttentionScaling(double factor) {
  if (factor <= 1.0) return 1.0f;
  return static_cast<float>(0.1 * std::log(factor) + 1.0);
}

void ApplyRope(float* x, int64_t tokens, int64_t heads, int64_t head_dim,
               const int64_t* positions, const float* inv_freq, float scaling) {
  const int64_t half = head_dim / 2;
  std::vector<float> cosv(half), sinv(half);
  for (int64_t t = 0; t < tokens; ++t) {
    const float pos = static_cast<float>(positions[t]);
    for (int64_t j = 0; j < half; ++j) {
      float angle = pos * inv_freq[j];
      cosv[j] = std::cos(angle) * scaling;
      sinv[j] = std::sin(angle) * scaling;
    }
    for (int64_t h = 0; h < heads; ++h) {
      float* v = x + (t * heads + h) * head_dim;
      for (int64_t j = 0; j < half; ++j) {
        float x1 = v[j], x2 = v[j + half];
        v[j] = x1 * cosv[j] - x2 * sinv[j];
        v[j + half] = x2 * cosv[j] + x1 * sinv[j];
      }
    }
  }
}

bool Attention(ThreadPool* pool, const AttentionItem* items, int64_t num_items, int64_t q_heads,
               int64_t kv_heads, int64_t head_dim, const float* sinks, int64_t window,
               float scale) {
  // Check the cache holds every position a query needs before touching anything.
  std::vector<int64_t> offsets(num_items + 1, 0);
  for (int64_t i = 0; i < num_items; ++i) {
    const AttentionItem& it = items[i];
    if (it.start_pos > 0) {
      if (it.cache.end != it.start_pos) return false;
      int64_t lo = window > 0 ? std::max<int64_t>(0, it.start_pos - window + 1) : 0;
      if (lo < it.start_pos) {
        if (it.cache.begin > lo) return false;
        for (int64_t j = lo; j < it.start_pos; j += it.cache.block_size) {
          if (it.cache.block_table[j / it.cache.block_size] < 0) return false;
        }
        if (it.cache.block_table[(it.start_pos - 1) / it.cache.block_size] < 0) return false;
      }
    }
    offsets[i + 1] = offsets[i] + it.num_new * q_heads;
  }
  const int64_t group = q_heads / kv_heads;
  const int64_t total = offsets[num_items];
  ParallelFor(pool, total, [&](int64_t w_begin, int64_t w_end) {
    std::vector<float> scores;
    int64_t item = static_cast<int64_t>(
                       std::upper_bound(offsets.begin(), offsets.end(), w_begin) - offsets.begin()) -
                   1;
    for (int64_t w = w_begin; w < w_end; ++w) {
      while (w >= offsets[item + 1]) ++item;
      const AttentionItem& it = items[item];
      const int64_t local = w - offsets[item];
      const int64_t t = local / q_heads;
      const int64_t h = local % q_heads;
      const int64_t g = h / group;
      const int64_t pos = it.start_pos + t;
      const int64_t lo = window > 0 ? std::max<int64_t>(0, pos - window + 1) : 0;
      const int64_t n = pos - lo + 1;
      scores.resize(n);
      const float* q = it.q + (t * q_heads + h) * head_dim;
      const KvCacheView& c = it.cache;
      auto key = [&](int64_t j) -> const float* {
        if (j >= it.start_pos) return it.k_new + ((j - it.start_pos) * kv_heads + g) * head_dim;
        const float* blk = c.arena + c.block_table[j / c.block_size] * c.block_floats;
        return blk + ((j % c.block_size) * kv_heads + g) * head_dim;
      };
      auto value = [&](int64_t j) -> const float* {
        if (j >= it.start_pos) return it.v_new + ((j - it.start_pos) * kv_heads + g) * head_dim;
        const float* blk = c.arena + c.block_table[j / c.block_size] * c.block_floats +
                           c.block_floats / 2;
        return blk + ((j % c.block_size) * kv_heads + g) * head_dim;
      };
      float mx = sinks[h];
      for (int64_t j = lo; j <= pos; ++j) {
        float s = Dot(q, key(j), head_dim) * scale;
        scores[j - lo] = s;
        mx = std::max(mx, s);
      }
      float sum = std::exp(sinks[h] - mx);
      for (int64_t j = 0; j < n; ++j) {
        scores[j] = std::exp(scores[j] - mx);
        sum += scores[j];
      }
      float* out = it.out + (t * q_heads + h) * head_dim;
      std::fill(out, out + head_dim, 0.0f);
      for (int64_t j = lo; j <= pos; ++j) {
        const float p = scores[j - lo] / sum;
        const float* v = value(j);
        for (int64_t d = 0; d < head_dim; ++d) out[d] += p * v[d];
      }
    }
  });
  return true;
}

void RouterTopK(const float* logits, int64_t rows, int64_t num_experts, int64_t k,
                int32_t* indices, float* weights) {
  std::vector<char> taken(num_experts);
  for (int64_t r = 0; r < rows; ++r) {
    const float* l = logits + r * num_experts;
    std::fill(taken.begin(), taken.end(), 0);
    int32_t* idx = indices + r * k;
    float* wt = weights + r * k;
    for (int64_t s = 0; s < k; ++s) {
      int64_t best = -1;
      for (int64_t e = 0; e < num_experts; ++e) {
        if (taken[e]) continue;
        // Strictly greater keeps the lower index on ties; NaN never wins.
        if (best < 0 || l[e] > l[best]) best = e;
      }
      taken[best] = 1;
      idx[s] = static_cast<int32_t>(best);
      wt[s] = l[best];
    }
    const float mx = wt[0];
    float sum = 0;
    for (int64_t s = 0; s < k; ++s) {
      wt[s] = std::exp(wt[s] - mx);
      sum += wt[s];
    }
    for (int64_t s = 0; s < k; ++s) wt[s] /= sum;
  }
}

}  // namespace flotilla::kernels::cpu
