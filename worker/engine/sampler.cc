#include "worker/engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>

#include "absl/strings/str_cat.h"

namespace flotilla {

void LogSoftmax(const float* logits, int64_t n, float* out) {
  float mx = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i) mx = std::max(mx, logits[i]);
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(static_cast<double>(logits[i] - mx));
  const float lse = mx + static_cast<float>(std::log(sum));
  for (int64_t i = 0; i < n; ++i) out[i] = logits[i] - lse;
}

int32_t Argmax(const float* values, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i) {
    if (values[i] > values[best]) best = i;
  }
  return static_cast<int32_t>(best);
}

absl::Status SamplingParams::Validate(int vocab_size) const {
  auto bad = [](auto&&... parts) { return absl::InvalidArgumentError(absl::StrCat(parts...)); };
  if (!(temperature >= 0.0f) || !std::isfinite(temperature)) {
    return bad("temperature must be a finite number >= 0, got ", temperature);
  }
  if (!(top_p > 0.0f && top_p <= 1.0f)) return bad("top_p must be in (0, 1], got ", top_p);
  if (top_k < 0) return bad("top_k must be >= 0 (0 = off), got ", top_k);
  if (!(min_p >= 0.0f && min_p <= 1.0f)) return bad("min_p must be in [0, 1], got ", min_p);
  if (!(frequency_penalty >= -2.0f && frequency_penalty <= 2.0f)) {
    return bad("frequency_penalty must be in [-2, 2], got ", frequency_penalty);
  }
  if (!(presence_penalty >= -2.0f && presence_penalty <= 2.0f)) {
    return bad("presence_penalty must be in [-2, 2], got ", presence_penalty);
  }
  if (!(repetition_penalty > 0.0f && repetition_penalty <= 2.0f)) {
    return bad("repetition_penalty must be in (0, 2], got ", repetition_penalty);
  }
  for (const auto& [token, bias] : logit_bias) {
    if (token < 0 || token >= vocab_size) {
      return bad("logit_bias token id ", token, " is out of range [0, ", vocab_size, ")");
    }
    if (!(bias >= -100.0f && bias <= 100.0f)) {
      return bad("logit_bias for token ", token, " must be in [-100, 100], got ", bias);
    }
  }
  if (top_logprobs < 0 || top_logprobs > 20) {
    return bad("top_logprobs must be in [0, 20], got ", top_logprobs);
  }
  if (top_logprobs > 0 && !logprobs) return bad("top_logprobs needs logprobs");
  if (max_tokens < 1) return bad("max_tokens must be >= 1, got ", max_tokens);
  if (min_tokens < 0 || min_tokens > max_tokens) {
    return bad("min_tokens must be in [0, max_tokens = ", max_tokens, "], got ", min_tokens);
  }
  if (stop_token_ids) {
    for (int t : *stop_token_ids) {
      if (t < 0 || t >= vocab_size) {
        return bad("stop token id ", t, " is out of range [0, ", vocab_size, ")");
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Sampler>> Sampler::Create(const SamplingParams& params,
                                                         int vocab_size,
                                                         const std::vector<int32_t>& prompt) {
  if (vocab_size <= 0) return absl::InvalidArgumentError("sampler: vocab_size must be positive");
  if (absl::Status st = params.Validate(vocab_size); !st.ok()) return st;
  for (int32_t t : prompt) {
    if (t < 0 || t >= vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("prompt token id ", t, " is out of range"));
    }
  }
  std::random_device random;
  const uint64_t seed =
      params.seed ? *params.seed : (static_cast<uint64_t>(random()) << 32) ^ random();
  return std::unique_ptr<Sampler>(new Sampler(params, vocab_size, seed, prompt));
}

Sampler::Sampler(const SamplingParams& params, int vocab_size, uint64_t seed,
                 const std::vector<int32_t>& prompt)
    : params_(params), vocab_size_(vocab_size), seed_(seed) {
  if (params_.repetition_penalty != 1.0f) {
    prompt_tokens_ = prompt;
    std::sort(prompt_tokens_.begin(), prompt_tokens_.end());
    prompt_tokens_.erase(std::unique(prompt_tokens_.begin(), prompt_tokens_.end()),
                         prompt_tokens_.end());
  }
  std::sort(params_.logit_bias.begin(), params_.logit_bias.end());
}

void Sampler::Record(int32_t token) {
  if (filter_) filter_->Accept(token);
  ++counts_[token];
  ++draws_;
  adjustments_stale_ = true;
}

const std::vector<LogitAdjustment>& Sampler::Adjustments() {
  if (!adjustments_stale_) return adjustments_;
  adjustments_stale_ = false;
  adjustments_.clear();
  const bool penalties = params_.frequency_penalty != 0.0f || params_.presence_penalty != 0.0f;
  const bool repetition = params_.repetition_penalty != 1.0f;
  // min_tokens: the stop tokens wait until that many were drawn.
  const std::vector<int>* suppressed =
      params_.stop_token_ids && static_cast<int64_t>(draws_) < params_.min_tokens
          ? &*params_.stop_token_ids
          : nullptr;
  if (!penalties && !repetition && params_.logit_bias.empty() && suppressed == nullptr) {
    return adjustments_;
  }
  // Every token that can change: the prompt's (repetition), the output's,
  // the biased and the suppressed ones; then one entry per token in
  // ascending order.
  std::vector<int32_t> tokens = prompt_tokens_;
  for (const auto& [token, count] : counts_) tokens.push_back(token);
  for (const auto& [token, bias] : params_.logit_bias) tokens.push_back(token);
  if (suppressed != nullptr) tokens.insert(tokens.end(), suppressed->begin(), suppressed->end());
  std::sort(tokens.begin(), tokens.end());
  tokens.erase(std::unique(tokens.begin(), tokens.end()), tokens.end());
  for (int32_t token : tokens) {
    auto count_it = counts_.find(token);
    const int64_t count = count_it == counts_.end() ? 0 : count_it->second;
    const bool seen =
        count > 0 || std::binary_search(prompt_tokens_.begin(), prompt_tokens_.end(), token);
    auto bias_it = std::lower_bound(params_.logit_bias.begin(), params_.logit_bias.end(),
                                    std::make_pair(token, -1e30f));
    const float bias = bias_it != params_.logit_bias.end() && bias_it->first == token
                           ? bias_it->second
                           : 0.0f;
    LogitAdjustment a;
    a.token = token;
    a.repetition = repetition && seen ? params_.repetition_penalty : 1.0f;
    a.add = bias - (static_cast<float>(count) * params_.frequency_penalty +
                    (count > 0 ? params_.presence_penalty : 0.0f));
    if (suppressed != nullptr &&
        std::find(suppressed->begin(), suppressed->end(), token) != suppressed->end()) {
      a.add += kSuppressedLogitAdd;
    }
    if (a.repetition != 1.0f || a.add != 0.0f) adjustments_.push_back(a);
  }
  return adjustments_;
}

double Sampler::NextUniform() {
  // SplitMix64's output at position draws_ of the stream seeded with seed_:
  // the value depends only on (seed, draw), as the GPU's Philox draw does,
  // so a resumed request whose draw count starts at k draws what an
  // undisturbed one draws for its token k + 1. 53 random bits: the same
  // value on every platform.
  uint64_t z = seed_ + (draws_ + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * (1.0 / 9007199254740992.0);
}

void Sampler::Penalise(const float* logits, std::vector<float>* out) {
  out->assign(logits, logits + vocab_size_);
  for (const LogitAdjustment& a : Adjustments()) {
    (*out)[a.token] = AdjustLogit((*out)[a.token], a.repetition, a.add);
  }
  if (const uint32_t* allowed = Allowed()) MaskLogits(allowed, vocab_size_, out->data());
}

void MaskLogits(const uint32_t* allowed, int64_t n, float* logits) {
  bool any = false;
  for (int64_t w = 0; w < (n + 31) / 32 && !any; ++w) any = allowed[w] != 0;
  if (!any) return;  // nothing allowed: the filter reports the failure on Accept
  for (int64_t t = 0; t < n; ++t) {
    if (!((allowed[t >> 5] >> (t & 31)) & 1)) logits[t] = -std::numeric_limits<float>::infinity();
  }
}

std::vector<std::pair<int32_t, float>> Sampler::Distribution(const float* logits) {
  Penalise(logits, &work_);
  std::vector<std::pair<int32_t, float>> dist;
  if (params_.temperature == 0.0f) {
    dist.emplace_back(Argmax(work_.data(), vocab_size_), 1.0f);
    return dist;
  }
  const float inv_t = 1.0f / params_.temperature;
  float mx = -std::numeric_limits<float>::infinity();
  for (float& v : work_) {
    v *= inv_t;
    mx = std::max(mx, v);
  }
  // Unnormalised probabilities; only their ratios matter below. A masked
  // token (-inf) has none, without an exp.
  const float masked = -std::numeric_limits<float>::infinity();
  for (float& v : work_) v = v == masked ? 0.0f : std::exp(v - mx);
  order_.resize(vocab_size_);
  std::iota(order_.begin(), order_.end(), 0);
  auto by_prob = [&](int32_t a, int32_t b) {
    return work_[a] > work_[b] || (work_[a] == work_[b] && a < b);
  };
  int64_t keep = vocab_size_;
  if (params_.top_k > 0 && params_.top_k < vocab_size_) {
    keep = params_.top_k;
    std::partial_sort(order_.begin(), order_.begin() + keep, order_.end(), by_prob);
  } else if (params_.top_p < 1.0f) {
    std::sort(order_.begin(), order_.end(), by_prob);
  }
  if (params_.top_p < 1.0f) {
    double total = 0;
    for (int64_t i = 0; i < keep; ++i) total += work_[order_[i]];
    double cum = 0;
    int64_t n = 0;
    while (n < keep) {
      cum += work_[order_[n]];
      ++n;
      if (cum >= params_.top_p * total) break;
    }
    keep = n;
  }
  // The most likely token has weight exp(0) = 1 (before top-k it is still the max).
  const float floor = params_.min_p;
  double total = 0;
  for (int64_t i = 0; i < keep; ++i) {
    float p = work_[order_[i]];
    // A token of probability 0 is never drawn; leaving it out also keeps
    // Sample's last-entry fallback (the draw past a sum rounded below 1) on a
    // token that may be drawn, never a masked one.
    if (p == 0.0f || (floor > 0.0f && p < floor)) continue;
    dist.emplace_back(order_[i], p);
    total += p;
  }
  for (auto& [token, p] : dist) p = static_cast<float>(p / total);
  return dist;
}

int32_t Sampler::Sample(const float* logits, TokenLogprob* logprob) {
  std::vector<std::pair<int32_t, float>> dist = Distribution(logits);
  int32_t token = dist.back().first;
  if (dist.size() > 1) {
    double u = NextUniform();
    double cum = 0;
    for (const auto& [t, p] : dist) {
      cum += p;
      if (u < cum) {
        token = t;
        break;
      }
    }
  }
  if (logprob != nullptr) {
    std::vector<float> lp(vocab_size_);
    LogSoftmax(logits, vocab_size_, lp.data());
    logprob->token = token;
    logprob->logprob = lp[token];
    logprob->top.clear();
    const int n = std::min(params_.top_logprobs, vocab_size_);
    if (n > 0) {
      std::vector<int32_t> idx(vocab_size_);
      std::iota(idx.begin(), idx.end(), 0);
      std::partial_sort(idx.begin(), idx.begin() + n, idx.end(), [&](int32_t a, int32_t b) {
        return lp[a] > lp[b] || (lp[a] == lp[b] && a < b);
      });
      for (int i = 0; i < n; ++i) logprob->top.emplace_back(idx[i], lp[idx[i]]);
    }
  }
  Record(token);
  return token;
}

}  // namespace flotilla
