// A deliberately plain gpt-oss forward pass in double, written from MODEL.md
// for tests: no cache, no batching, whole matrices dequantised. Slow; use
// only with tiny configs.
#pragma once

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "common/bf16.h"
#include "worker/model/weights.h"

namespace flotilla::testing {

inline double B(const uint16_t* p, int64_t i) { return Bf16ToFloat(p[i]); }

inline double Fp4(int nibble) {
  static const double kValues[16] = {0, .5, 1, 1.5, 2, 3, 4, 6, -0.0, -.5, -1, -1.5, -2, -3, -4, -6};
  return kValues[nibble];
}

inline double Mx(const Mxfp4Matrix& m, int64_t r, int64_t c) {
  const int64_t nb = m.cols / 32;
  const uint8_t byte = m.blocks[(r * nb + c / 32) * 16 + (c % 32) / 2];
  return Fp4(c % 2 == 0 ? byte & 15 : byte >> 4) * std::pow(2.0, m.scales[r * nb + c / 32] - 127.0);
}

inline std::vector<double> MatVec(const Bf16Matrix& m, const std::vector<double>& x,
                                  const Bf16Vector* bias) {
  std::vector<double> y(m.rows);
  for (int64_t r = 0; r < m.rows; ++r) {
    double s = bias ? B(bias->data, r) : 0.0;
    for (int64_t c = 0; c < m.cols; ++c) s += B(m.data, r * m.row_stride + c) * x[c];
    y[r] = s;
  }
  return y;
}

inline std::vector<double> RmsNorm(const std::vector<double>& x, const Bf16Vector& w, double eps) {
  double ss = 0;
  for (double v : x) ss += v * v;
  const double inv = 1 / std::sqrt(ss / x.size() + eps);
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * inv * B(w.data, i);
  return y;
}

inline void Rope(std::vector<double>& v, int64_t heads, int64_t D, int64_t pos,
                 const ModelConfig& c) {
  const auto& rs = c.rope_scaling;
  const double low = (D / 2.0) * std::log(rs.original_max_position_embeddings / (rs.beta_fast * 2 * M_PI)) /
                     std::log(c.rope_theta);
  const double high = (D / 2.0) * std::log(rs.original_max_position_embeddings / (rs.beta_slow * 2 * M_PI)) /
                      std::log(c.rope_theta);
  const double mscale = 0.1 * std::log(rs.factor) + 1;
  for (int64_t h = 0; h < heads; ++h) {
    double* x = &v[h * D];
    for (int64_t j = 0; j < D / 2; ++j) {
      double freq = std::pow(c.rope_theta, 2.0 * j / D);
      double mask = 1 - std::clamp((j - low) / (high - low), 0.0, 1.0);
      double inv = (1 / (rs.factor * freq)) * (1 - mask) + (1 / freq) * mask;
      double cs = std::cos(pos * inv) * mscale, sn = std::sin(pos * inv) * mscale;
      double x1 = x[j], x2 = x[j + D / 2];
      x[j] = x1 * cs - x2 * sn;
      x[j + D / 2] = x2 * cs + x1 * sn;
    }
  }
}

// Logits [T][V] at every position of `tokens`.
inline std::vector<std::vector<double>> ReferenceForward(const ModelWeights& w,
                                                         const std::vector<int32_t>& tokens) {
  const ModelConfig& c = w.config;
  const int64_t T = tokens.size(), H = c.hidden_size, D = c.head_dim;
  const int64_t NH = c.num_attention_heads, NKV = c.num_key_value_heads;
  std::vector<std::vector<double>> x(T, std::vector<double>(H));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < H; ++h) x[t][h] = B(w.embed.data, tokens[t] * w.embed.row_stride + h);
  }
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const LayerWeights& L = w.layers[l];
    std::vector<std::vector<double>> q(T), k(T), v(T);
    for (int64_t t = 0; t < T; ++t) {
      auto n = RmsNorm(x[t], L.input_norm, c.rms_norm_eps);
      q[t] = MatVec(L.attn.wq, n, &L.attn.bq);
      k[t] = MatVec(L.attn.wk, n, &L.attn.bk);
      v[t] = MatVec(L.attn.wv, n, &L.attn.bv);
      Rope(q[t], NH, D, t, c);
      Rope(k[t], NKV, D, t, c);
    }
    for (int64_t i = 0; i < T; ++i) {
      std::vector<double> a(NH * D, 0.0);
      for (int64_t h = 0; h < NH; ++h) {
        const int64_t g = h / (NH / NKV);
        std::vector<double> s;
        std::vector<int64_t> js;
        for (int64_t j = 0; j <= i; ++j) {
          if (c.is_sliding(l) && !(i - c.sliding_window < j)) continue;
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += q[i][h * D + d] * k[j][g * D + d];
          s.push_back(dot / std::sqrt(double(D)));
          js.push_back(j);
        }
        double mx = L.attn.sinks[h];
        for (double e : s) mx = std::max(mx, e);
        double z = std::exp(L.attn.sinks[h] - mx);
        for (double e : s) z += std::exp(e - mx);
        for (size_t m = 0; m < js.size(); ++m) {
          for (int64_t d = 0; d < D; ++d) a[h * D + d] += std::exp(s[m] - mx) / z * v[js[m]][g * D + d];
        }
      }
      auto o = MatVec(L.attn.wo, a, &L.attn.bo);
      for (int64_t h = 0; h < H; ++h) x[i][h] += o[h];
      // MoE
      auto n = RmsNorm(x[i], L.post_attn_norm, c.rms_norm_eps);
      auto r = MatVec(L.router, n, &L.router_bias);
      std::vector<int> idx(r.size());
      std::iota(idx.begin(), idx.end(), 0);
      std::stable_sort(idx.begin(), idx.end(), [&](int a1, int b1) { return r[a1] > r[b1]; });
      const int K = c.num_experts_per_tok;
      double z = 0;
      for (int s = 0; s < K; ++s) z += std::exp(r[idx[s]] - r[idx[0]]);
      const int64_t I = c.intermediate_size;
      for (int s = 0; s < K; ++s) {
        const double wt = std::exp(r[idx[s]] - r[idx[0]]) / z;
        const ExpertWeights& e = L.experts[L.slot_of_expert[idx[s]]];
        std::vector<double> act(I);
        for (int64_t j = 0; j < I; ++j) {
          double gate = B(e.gate_up_bias.data, 2 * j), up = B(e.gate_up_bias.data, 2 * j + 1);
          for (int64_t cc = 0; cc < H; ++cc) {
            gate += Mx(e.gate_up, 2 * j, cc) * n[cc];
            up += Mx(e.gate_up, 2 * j + 1, cc) * n[cc];
          }
          gate = std::min(gate, c.swiglu_limit);
          up = std::clamp(up, -c.swiglu_limit, c.swiglu_limit);
          act[j] = gate / (1 + std::exp(-1.702 * gate)) * (up + 1);
        }
        for (int64_t h = 0; h < H; ++h) {
          double d = B(e.down_bias.data, h);
          for (int64_t j = 0; j < I; ++j) d += Mx(e.down, h, j) * act[j];
          x[i][h] += wt * d;
        }
      }
    }
  }
  std::vector<std::vector<double>> logits(T);
  for (int64_t t = 0; t < T; ++t) {
    logits[t] = MatVec(w.lm_head, RmsNorm(x[t], w.final_norm, c.rms_norm_eps), nullptr);
  }
  return logits;
}

}  // namespace flotilla::testing
