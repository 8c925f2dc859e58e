#include "worker/model/load_weights.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/bf16.h"
#include "common/status.h"

namespace flotilla {
namespace {

// The views the engine reads are typed pointers, so bf16 data must sit on an
// even address (safetensors writers align the data area; a file that does
// not is rejected rather than read through a misaligned pointer).
absl::StatusOr<const uint16_t*> Bf16Data(const Checkpoint& ck, const TensorInfo* t) {
  if (reinterpret_cast<uintptr_t>(t->data) % alignof(uint16_t) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        ck.dir(), ": tensor '", t->name, "' starts at an odd byte offset; BF16 data must be 2-byte aligned"));
  }
  return reinterpret_cast<const uint16_t*>(t->data);
}

class Loader {
 public:
  explicit Loader(const Checkpoint& ck) : ck_(ck) {}

  absl::StatusOr<Bf16Matrix> Matrix(const std::string& name, int64_t rows, int64_t cols) {
    FLOTILLA_ASSIGN_OR_RETURN(const TensorInfo* t, ck_.Get({name, DType::kBF16, {rows, cols}}));
    FLOTILLA_ASSIGN_OR_RETURN(const uint16_t* p, Bf16Data(ck_, t));
    return Bf16Matrix{p, rows, cols, cols};
  }
  absl::StatusOr<Bf16Vector> Vector(const std::string& name, int64_t size) {
    FLOTILLA_ASSIGN_OR_RETURN(const TensorInfo* t, ck_.Get({name, DType::kBF16, {size}}));
    FLOTILLA_ASSIGN_OR_RETURN(const uint16_t* p, Bf16Data(ck_, t));
    return Bf16Vector{p, size};
  }
  absl::StatusOr<const TensorInfo*> Tensor(const std::string& name, DType dtype,
                                           std::vector<int64_t> shape) {
    FLOTILLA_ASSIGN_OR_RETURN(const TensorInfo* t, ck_.Get({name, dtype, std::move(shape)}));
    if (dtype == DType::kBF16) FLOTILLA_RETURN_IF_ERROR(Bf16Data(ck_, t).status());
    return t;
  }

 private:
  const Checkpoint& ck_;
};

}  // namespace

absl::Status CheckShardSpec(const ModelConfig& c, const ShardSpec& s, std::vector<int>* experts) {
  if (s.tp_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("shard: tp_size must be >= 1, got ", s.tp_size));
  }
  if (s.tp_rank < 0 || s.tp_rank >= s.tp_size) {
    return absl::InvalidArgumentError(absl::StrCat("shard: tp_rank ", s.tp_rank,
                                                   " is outside [0, tp_size=", s.tp_size, ")"));
  }
  if (c.num_attention_heads % s.tp_size != 0 || c.num_key_value_heads % s.tp_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shard: tp_size ", s.tp_size, " must divide num_attention_heads (", c.num_attention_heads,
        ") and num_key_value_heads (", c.num_key_value_heads, ")"));
  }
  const int E = c.num_local_experts;
  experts->clear();
  if (s.experts.empty()) {
    for (int e = 0; e < E; ++e) experts->push_back(e);
    return absl::OkStatus();
  }
  std::vector<bool> seen(E, false);
  for (int e : s.experts) {
    if (e < 0 || e >= E) {
      return absl::InvalidArgumentError(
          absl::StrCat("shard: expert id ", e, " is outside [0, num_local_experts=", E, ")"));
    }
    if (seen[e]) return absl::InvalidArgumentError(absl::StrCat("shard: expert ", e, " listed twice"));
    seen[e] = true;
    experts->push_back(e);
  }
  return absl::OkStatus();
}

namespace {

absl::StatusOr<std::vector<float>> Sinks(const Checkpoint& ck, const std::string& name, int64_t nh,
                                         int begin, int count) {
  FLOTILLA_ASSIGN_OR_RETURN(const TensorInfo* t, ck.Get(name, {DType::kBF16, DType::kF32}, {nh}));
  std::vector<float> out(count);
  for (int h = 0; h < count; ++h) {
    if (t->dtype == DType::kF32) {
      std::memcpy(&out[h], t->data + 4 * (begin + h), 4);
    } else {
      uint16_t bits;
      std::memcpy(&bits, t->data + 2 * (begin + h), 2);
      out[h] = Bf16ToFloat(bits);
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<ModelWeights> LoadWeights(std::shared_ptr<const Checkpoint> checkpoint,
                                         const ShardSpec& shard) {
  if (checkpoint == nullptr) return absl::InvalidArgumentError("LoadWeights: no checkpoint");
  const Checkpoint& ck = *checkpoint;
  const ModelConfig& c = ck.config();
  std::vector<int> experts;
  FLOTILLA_RETURN_IF_ERROR(CheckShardSpec(c, shard, &experts));

  const int64_t H = c.hidden_size, I = c.intermediate_size, E = c.num_local_experts;
  const int64_t D = c.head_dim, NH = c.num_attention_heads, NKV = c.num_key_value_heads;
  const int64_t V = c.vocab_size;
  const int q_heads = static_cast<int>(NH / shard.tp_size);
  const int kv_heads = static_cast<int>(NKV / shard.tp_size);
  const int q_begin = shard.tp_rank * q_heads;
  const int kv_begin = shard.tp_rank * kv_heads;

  Loader load(ck);
  ModelWeights w;
  w.config = c;
  if (shard.load_embedding) {
    FLOTILLA_ASSIGN_OR_RETURN(w.embed, load.Matrix("model.embed_tokens.weight", V, H));
  }
  if (shard.load_lm_head) {
    FLOTILLA_ASSIGN_OR_RETURN(
        w.lm_head,
        load.Matrix(c.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight", V, H));
  }
  FLOTILLA_ASSIGN_OR_RETURN(w.final_norm, load.Vector("model.norm.weight", H));

  for (int l = 0; l < c.num_hidden_layers; ++l) {
    auto name = [l](absl::string_view suffix) { return LayerTensorName(l, suffix); };
    LayerWeights lw;
    FLOTILLA_ASSIGN_OR_RETURN(lw.input_norm, load.Vector(name("input_layernorm.weight"), H));
    FLOTILLA_ASSIGN_OR_RETURN(lw.post_attn_norm,
                              load.Vector(name("post_attention_layernorm.weight"), H));

    AttentionWeights& a = lw.attn;
    a.q_head_begin = q_begin;
    a.q_heads = q_heads;
    a.kv_head_begin = kv_begin;
    a.kv_heads = kv_heads;
    // Rows of q/k/v are contiguous per head: this rank's heads are a row range.
    auto rows = [&](const std::string& w_name, const std::string& b_name, int64_t total_heads,
                    int begin, int heads, Bf16Matrix* m, Bf16Vector* b) -> absl::Status {
      FLOTILLA_ASSIGN_OR_RETURN(Bf16Matrix full, load.Matrix(w_name, total_heads * D, H));
      FLOTILLA_ASSIGN_OR_RETURN(Bf16Vector full_b, load.Vector(b_name, total_heads * D));
      *m = Bf16Matrix{full.data + begin * D * H, heads * D, H, H};
      *b = Bf16Vector{full_b.data + begin * D, heads * D};
      return absl::OkStatus();
    };
    FLOTILLA_RETURN_IF_ERROR(rows(name("self_attn.q_proj.weight"), name("self_attn.q_proj.bias"), NH,
                                  q_begin, q_heads, &a.wq, &a.bq));
    FLOTILLA_RETURN_IF_ERROR(rows(name("self_attn.k_proj.weight"), name("self_attn.k_proj.bias"), NKV,
                                  kv_begin, kv_heads, &a.wk, &a.bk));
    FLOTILLA_RETURN_IF_ERROR(rows(name("self_attn.v_proj.weight"), name("self_attn.v_proj.bias"), NKV,
                                  kv_begin, kv_heads, &a.wv, &a.bv));
    // o_proj consumes the concatenated heads: this rank's heads are a column range.
    FLOTILLA_ASSIGN_OR_RETURN(Bf16Matrix wo, load.Matrix(name("self_attn.o_proj.weight"), H, NH * D));
    a.wo = Bf16Matrix{wo.data + q_begin * D, H, q_heads * D, NH * D};
    FLOTILLA_ASSIGN_OR_RETURN(a.bo, load.Vector(name("self_attn.o_proj.bias"), H));
    FLOTILLA_ASSIGN_OR_RETURN(a.sinks, Sinks(ck, name("self_attn.sinks"), NH, q_begin, q_heads));

    FLOTILLA_ASSIGN_OR_RETURN(lw.router, load.Matrix(name("mlp.router.weight"), E, H));
    FLOTILLA_ASSIGN_OR_RETURN(lw.router_bias, load.Vector(name("mlp.router.bias"), E));

    FLOTILLA_ASSIGN_OR_RETURN(
        const TensorInfo* gu_blocks,
        load.Tensor(name("mlp.experts.gate_up_proj_blocks"), DType::kU8, {E, 2 * I, H / 32, 16}));
    FLOTILLA_ASSIGN_OR_RETURN(
        const TensorInfo* gu_scales,
        load.Tensor(name("mlp.experts.gate_up_proj_scales"), DType::kU8, {E, 2 * I, H / 32}));
    FLOTILLA_ASSIGN_OR_RETURN(
        const TensorInfo* gu_bias,
        load.Tensor(name("mlp.experts.gate_up_proj_bias"), DType::kBF16, {E, 2 * I}));
    FLOTILLA_ASSIGN_OR_RETURN(
        const TensorInfo* dn_blocks,
        load.Tensor(name("mlp.experts.down_proj_blocks"), DType::kU8, {E, H, I / 32, 16}));
    FLOTILLA_ASSIGN_OR_RETURN(
        const TensorInfo* dn_scales,
        load.Tensor(name("mlp.experts.down_proj_scales"), DType::kU8, {E, H, I / 32}));
    FLOTILLA_ASSIGN_OR_RETURN(
        const TensorInfo* dn_bias,
        load.Tensor(name("mlp.experts.down_proj_bias"), DType::kBF16, {E, H}));

    lw.slot_of_expert.assign(E, -1);
    for (int e : experts) {
      ExpertWeights ex;
      ex.expert_id = e;
      ex.gate_up.blocks = gu_blocks->data + e * (2 * I) * (H / 32) * 16;
      ex.gate_up.scales = gu_scales->data + e * (2 * I) * (H / 32);
      ex.gate_up.rows = 2 * I;
      ex.gate_up.cols = H;
      ex.gate_up_bias = {reinterpret_cast<const uint16_t*>(gu_bias->data) + e * 2 * I, 2 * I};
      ex.down.blocks = dn_blocks->data + e * H * (I / 32) * 16;
      ex.down.scales = dn_scales->data + e * H * (I / 32);
      ex.down.rows = H;
      ex.down.cols = I;
      ex.down_bias = {reinterpret_cast<const uint16_t*>(dn_bias->data) + e * H, H};
      lw.slot_of_expert[e] = static_cast<int>(lw.experts.size());
      lw.experts.push_back(ex);
    }
    w.layers.push_back(std::move(lw));
  }
  w.keepalive = std::move(checkpoint);
  return w;
}

}  // namespace flotilla
