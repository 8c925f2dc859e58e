#include "worker/model/synthetic_weights.h"

#include <cmath>
#include <deque>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/bf16.h"

namespace flotilla {
namespace {

// splitmix64: a fast, well-mixed counter-based generator.
inline uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Uniform in [-1, 1).
inline float Uniform(uint64_t stream, uint64_t i) {
  return static_cast<float>((Mix(stream ^ Mix(i)) >> 40) * (1.0 / 8388608.0)) - 1.0f;
}

struct Store {
  std::deque<std::vector<uint16_t>> bf16;
  std::deque<std::vector<uint8_t>> bytes;
};

class Filler {
 public:
  Filler(uint64_t seed, Store* store) : seed_(seed), store_(store) {}

  // A bf16 tensor of `n` values: center + amplitude * U(-1, 1).
  const uint16_t* Bf16(int64_t n, float amplitude, float center = 0.0f) {
    uint64_t stream = Mix(seed_ + 0x1000 * ++tensor_);
    std::vector<uint16_t>& v = store_->bf16.emplace_back(n);
    for (int64_t i = 0; i < n; ++i) v[i] = FloatToBf16(center + amplitude * Uniform(stream, i));
    return v.data();
  }
  // Random bytes; scales land in [scale_lo, scale_lo + scale_span).
  const uint8_t* Bytes(int64_t n, int scale_lo = -1, int scale_span = 0) {
    uint64_t stream = Mix(seed_ + 0x1000 * ++tensor_);
    std::vector<uint8_t>& v = store_->bytes.emplace_back(n);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
      uint64_t r = Mix(stream ^ Mix(i));
      for (int k = 0; k < 8; ++k) v[i + k] = static_cast<uint8_t>(r >> (8 * k));
    }
    for (; i < n; ++i) v[i] = static_cast<uint8_t>(Mix(stream ^ Mix(i)));
    if (scale_lo >= 0) {
      for (uint8_t& b : v) b = static_cast<uint8_t>(scale_lo + b % scale_span);
    }
    return v.data();
  }
  uint64_t position() const { return tensor_; }
  void Seek(uint64_t tensor) { tensor_ = tensor; }

 private:
  uint64_t seed_;
  uint64_t tensor_ = 0;
  Store* store_;
};

}  // namespace

absl::StatusOr<ModelWeights> MakeSyntheticWeights(const ModelConfig& c, uint64_t seed,
                                                  const ShardSpec& spec) {
  if (spec.tp_size < 1 || spec.tp_rank < 0 || spec.tp_rank >= spec.tp_size ||
      c.num_attention_heads % spec.tp_size != 0 || c.num_key_value_heads % spec.tp_size != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard: tp_size ", spec.tp_size, " / tp_rank ", spec.tp_rank,
                     " does not split ", c.num_attention_heads, " q heads and ",
                     c.num_key_value_heads, " kv heads"));
  }
  if (c.hidden_size % 32 != 0 || c.intermediate_size % 32 != 0) {
    return absl::InvalidArgumentError("hidden_size and intermediate_size must be multiples of 32");
  }
  std::vector<int> experts = spec.experts;
  if (experts.empty()) {
    for (int e = 0; e < c.num_local_experts; ++e) experts.push_back(e);
  }
  for (int e : experts) {
    if (e < 0 || e >= c.num_local_experts) {
      return absl::InvalidArgumentError(absl::StrCat("shard: expert ", e, " out of range [0, ",
                                                     c.num_local_experts, ")"));
    }
  }
  auto store = std::make_shared<Store>();
  Filler f(seed, store.get());
  const int64_t H = c.hidden_size, I = c.intermediate_size, D = c.head_dim;
  const int64_t NH = c.num_attention_heads, NKV = c.num_key_value_heads;
  const int64_t qh = NH / spec.tp_size, kvh = NKV / spec.tp_size;
  const float in_amp = 1.0f / std::sqrt(static_cast<float>(H));

  ModelWeights w;
  w.config = c;
  if (spec.load_embedding) w.embed = {f.Bf16(int64_t{c.vocab_size} * H, 1.0f), c.vocab_size, H, H};
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    LayerWeights L;
    L.input_norm = {f.Bf16(H, 0.2f, 1.0f), H};
    L.post_attn_norm = {f.Bf16(H, 0.2f, 1.0f), H};
    AttentionWeights& a = L.attn;
    a.q_head_begin = static_cast<int>(qh * spec.tp_rank);
    a.q_heads = static_cast<int>(qh);
    a.kv_head_begin = static_cast<int>(kvh * spec.tp_rank);
    a.kv_heads = static_cast<int>(kvh);
    // Draw the full tensors so every TP layout sees the same model.
    const uint16_t* wq = f.Bf16(NH * D * H, in_amp * 2);
    const uint16_t* bq = f.Bf16(NH * D, 0.1f);
    const uint16_t* wk = f.Bf16(NKV * D * H, in_amp * 2);
    const uint16_t* bk = f.Bf16(NKV * D, 0.1f);
    const uint16_t* wv = f.Bf16(NKV * D * H, in_amp * 2);
    const uint16_t* bv = f.Bf16(NKV * D, 0.1f);
    const uint16_t* wo = f.Bf16(H * NH * D, 1.0f / std::sqrt(static_cast<float>(NH * D)));
    const uint16_t* bo = f.Bf16(H, 0.1f);
    const uint16_t* sinks = f.Bf16(NH, 1.0f);
    a.wq = {wq + a.q_head_begin * D * H, qh * D, H, H};
    a.bq = {bq + a.q_head_begin * D, qh * D};
    a.wk = {wk + a.kv_head_begin * D * H, kvh * D, H, H};
    a.bk = {bk + a.kv_head_begin * D, kvh * D};
    a.wv = {wv + a.kv_head_begin * D * H, kvh * D, H, H};
    a.bv = {bv + a.kv_head_begin * D, kvh * D};
    a.wo = {wo + a.q_head_begin * D, H, qh * D, NH * D};
    a.bo = {bo, H};
    for (int h = 0; h < qh; ++h) a.sinks.push_back(Bf16ToFloat(sinks[a.q_head_begin + h]));
    const int64_t E = c.num_local_experts;
    L.router = {f.Bf16(E * H, in_amp * 4), E, H, H};
    L.router_bias = {f.Bf16(E, 0.5f), E};
    L.slot_of_expert.assign(E, -1);
    // Scales around 2^-4: fp4 magnitudes up to 6 give weights up to ~0.4.
    const int scale_lo = 127 - 6, scale_span = 3;
    // Each expert draws from its own streams, so a shard holding a subset
    // sees the same experts as one holding all of them.
    const uint64_t expert_base = f.position();
    for (int e : experts) {
      f.Seek(expert_base + 6 * static_cast<uint64_t>(e));
      ExpertWeights x;
      x.expert_id = e;
      x.gate_up = {f.Bytes(2 * I * H / 2), f.Bytes(2 * I * H / 32, scale_lo, scale_span), 2 * I, H};
      x.gate_up_bias = {f.Bf16(2 * I, 0.5f), 2 * I};
      x.down = {f.Bytes(H * I / 2), f.Bytes(H * I / 32, scale_lo - 1, scale_span), H, I};
      x.down_bias = {f.Bf16(H, 0.1f), H};
      L.slot_of_expert[e] = static_cast<int>(L.experts.size());
      L.experts.push_back(x);
    }
    f.Seek(expert_base + 6 * static_cast<uint64_t>(E));
    w.layers.push_back(std::move(L));
  }
  w.final_norm = {f.Bf16(H, 0.2f, 1.0f), H};
  if (spec.load_lm_head) w.lm_head = {f.Bf16(int64_t{c.vocab_size} * H, in_amp * 4), c.vocab_size, H, H};
  w.keepalive = store;
  return w;
}

}  // namespace flotilla
