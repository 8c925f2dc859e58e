#include "worker/eagle3_drafter.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/cpu/ops.h"

namespace flotilla::worker {
namespace k = kernels::cpu;

Eagle3Drafter::Eagle3Drafter(const Eagle3Head* head, k::ThreadPool* pool)
    : head_(head), pool_(pool) {
  const Eagle3Config& c = head->config;
  const int64_t D = c.head_dim;
  if (c.yarn) {
    k::YarnParams p;
    p.theta = c.rope_theta;
    p.head_dim = static_cast<int>(D);
    p.factor = c.yarn_factor;
    p.original_max_position_embeddings = c.yarn_original_max_position;
    p.beta_fast = c.yarn_beta_fast;
    p.beta_slow = c.yarn_beta_slow;
    inv_freq_ = k::YarnInvFreq(p);
    rope_scaling_ = k::YarnAttentionScaling(c.yarn_factor);
  } else {
    inv_freq_.resize(D / 2);
    for (int64_t i = 0; i < D / 2; ++i) {
      inv_freq_[i] = static_cast<float>(
          1.0 / std::pow(c.rope_theta, static_cast<double>(2 * i) / static_cast<double>(D)));
    }
  }
}

void Eagle3Drafter::AddHidden(int64_t first, const float* rows, int64_t n) {
  const Eagle3Config& c = head_->config;
  const int64_t width = static_cast<int64_t>(c.aux_layers.size()) * c.target_hidden_size;
  for (int64_t j = 0; j < n; ++j) {
    if (first + j <= last_) continue;  // committed already
    pending_[first + j].assign(rows + j * width, rows + (j + 1) * width);
  }
}

std::vector<int32_t> Eagle3Drafter::Propose(absl::Span<const int32_t> tokens, int k) {
  Commit(tokens);
  const int64_t length = static_cast<int64_t>(tokens.size());
  if (k <= 0 || length < 2 || last_ != length - 2) return {};
  std::vector<int32_t> draft;
  std::vector<float> state = last_out_, next;
  for (int j = 0; j < k; ++j) {
    draft.push_back(DraftToken(state.data()));
    if (j + 1 == k) break;
    RunLayer({last_ + 1 + j}, {draft.back()}, state, &next);
    state.swap(next);
  }
  return draft;
}

void Eagle3Drafter::Commit(absl::Span<const int32_t> tokens) {
  const Eagle3Config& c = head_->config;
  const int64_t kv_width = c.num_key_value_heads * c.head_dim;
  // The last Propose's drafted K/V go.
  kv_positions_.resize(committed_);
  k_.resize(committed_ * kv_width);
  v_.resize(committed_ * kv_width);
  std::vector<int64_t> positions;
  std::vector<int32_t> next_tokens;
  std::vector<float> aux;
  for (auto it = pending_.begin(); it != pending_.end();) {
    const int64_t q = it->first;
    if (q + 1 >= static_cast<int64_t>(tokens.size())) break;
    positions.push_back(q);
    next_tokens.push_back(tokens[q + 1]);
    aux.insert(aux.end(), it->second.begin(), it->second.end());
    it = pending_.erase(it);
  }
  if (positions.empty()) return;
  const int64_t n = static_cast<int64_t>(positions.size()), H = c.hidden_size;
  const int64_t fused = static_cast<int64_t>(c.aux_layers.size()) * c.target_hidden_size;
  std::vector<float> state(n * H), out;
  k::LinearBf16(pool_, aux.data(), n, fused, head_->fc.data(), fused, H, nullptr, state.data());
  RunLayer(positions, next_tokens, state, &out);
  committed_ = kv_positions_.size();
  last_ = positions.back();
  last_out_.assign(out.end() - H, out.end());
}

void Eagle3Drafter::RunLayer(const std::vector<int64_t>& positions,
                             const std::vector<int32_t>& tokens, const std::vector<float>& state,
                             std::vector<float>* out) {
  const Eagle3Config& c = head_->config;
  const int64_t n = static_cast<int64_t>(positions.size()), H = c.hidden_size;
  const int64_t D = c.head_dim, NH = c.num_attention_heads, NKV = c.num_key_value_heads;
  const int64_t I = c.intermediate_size;
  const float eps = static_cast<float>(c.rms_norm_eps);
  // [norm(embedded token), norm(state)] per row; the residual is the state.
  std::vector<float> embedded(n * H), normed_state(n * H), both(n * 2 * H);
  k::EmbeddingGather(head_->embedding.data, head_->embedding.row_stride, H, tokens.data(), n,
                     embedded.data());
  k::RmsNorm(embedded.data(), head_->input_norm.data(), n, H, eps, embedded.data());
  k::RmsNorm(state.data(), head_->hidden_norm.data(), n, H, eps, normed_state.data());
  for (int64_t r = 0; r < n; ++r) {
    std::copy_n(&embedded[r * H], H, &both[r * 2 * H]);
    std::copy_n(&normed_state[r * H], H, &both[r * 2 * H + H]);
  }
  std::vector<float> residual = c.norm_before_residual ? normed_state : state;
  std::vector<float> q(n * NH * D), kk(n * NKV * D), vv(n * NKV * D);
  k::LinearBf16(pool_, both.data(), n, 2 * H, head_->q_proj.data(), 2 * H, NH * D, nullptr,
                q.data());
  k::LinearBf16(pool_, both.data(), n, 2 * H, head_->k_proj.data(), 2 * H, NKV * D, nullptr,
                kk.data());
  k::LinearBf16(pool_, both.data(), n, 2 * H, head_->v_proj.data(), 2 * H, NKV * D, nullptr,
                vv.data());
  k::ApplyRope(q.data(), n, NH, D, positions.data(), inv_freq_.data(), rope_scaling_);
  k::ApplyRope(kk.data(), n, NKV, D, positions.data(), inv_freq_.data(), rope_scaling_);
  kv_positions_.insert(kv_positions_.end(), positions.begin(), positions.end());
  k_.insert(k_.end(), kk.begin(), kk.end());
  v_.insert(v_.end(), vv.begin(), vv.end());
  std::vector<float> attn, o(n * H);
  Attend(positions, q, &attn);
  k::LinearBf16(pool_, attn.data(), n, NH * D, head_->o_proj.data(), NH * D, H, nullptr, o.data());
  for (int64_t i = 0; i < n * H; ++i) residual[i] += o[i];
  // The MLP on the post-attention norm, added to the residual.
  std::vector<float> normed(n * H), gate(n * I), up(n * I), down(n * H);
  k::RmsNorm(residual.data(), head_->post_attention_norm.data(), n, H, eps, normed.data());
  k::LinearBf16(pool_, normed.data(), n, H, head_->gate_proj.data(), H, I, nullptr, gate.data());
  k::LinearBf16(pool_, normed.data(), n, H, head_->up_proj.data(), H, I, nullptr, up.data());
  for (int64_t i = 0; i < n * I; ++i) gate[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
  k::LinearBf16(pool_, gate.data(), n, I, head_->down_proj.data(), I, H, nullptr, down.data());
  for (int64_t i = 0; i < n * H; ++i) residual[i] += down[i];
  *out = std::move(residual);
}

void Eagle3Drafter::Attend(const std::vector<int64_t>& positions, const std::vector<float>& q,
                           std::vector<float>* out) const {
  const Eagle3Config& c = head_->config;
  const int64_t n = static_cast<int64_t>(positions.size()), D = c.head_dim;
  const int64_t NH = c.num_attention_heads, NKV = c.num_key_value_heads, group = NH / NKV;
  const int64_t rows = static_cast<int64_t>(kv_positions_.size());
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  out->assign(n * NH * D, 0.0f);
  std::vector<float> scores(rows);
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t h = 0; h < NH; ++h) {
      const float* qh = &q[(r * NH + h) * D];
      const int64_t kvh = h / group;
      float top = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < rows; ++j) {
        scores[j] = kv_positions_[j] <= positions[r]
                        ? k::Dot(qh, &k_[(j * NKV + kvh) * D], D) * scale
                        : -std::numeric_limits<float>::infinity();
        top = std::max(top, scores[j]);
      }
      float sum = 0.0f;
      for (int64_t j = 0; j < rows; ++j) {
        scores[j] = std::isinf(scores[j]) ? 0.0f : std::exp(scores[j] - top);
        sum += scores[j];
      }
      float* oh = &(*out)[(r * NH + h) * D];
      for (int64_t j = 0; j < rows; ++j) {
        if (scores[j] == 0.0f) continue;
        const float w = scores[j] / sum;
        const float* vj = &v_[(j * NKV + kvh) * D];
        for (int64_t d = 0; d < D; ++d) oh[d] += w * vj[d];
      }
    }
  }
}

int32_t Eagle3Drafter::DraftToken(const float* state) {
  const Eagle3Config& c = head_->config;
  const int64_t H = c.hidden_size;
  std::vector<float> normed(H), logits(c.draft_vocab_size);
  k::RmsNorm(state, head_->final_norm.data(), 1, H, static_cast<float>(c.rms_norm_eps),
             normed.data());
  k::LinearBf16(pool_, normed.data(), 1, H, head_->lm_head.data(), H, c.draft_vocab_size, nullptr,
                logits.data());
  const int64_t best = std::max_element(logits.begin(), logits.end()) - logits.begin();
  return head_->draft_to_target[best];
}

}  // namespace flotilla::worker
