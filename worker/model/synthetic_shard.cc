#include "worker/model/synthetic_shard.h"

#include <algorithm>
#include <memory>
#include <new>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/bf16.h"
#include "common/status.h"
#include "worker/model/load_weights.h"

namespace flotilla {
namespace {

// Host memory for a whole shard, kept alive by the ModelWeights viewing it.
class HostSliceWriter : public SyntheticSliceWriter {
 public:
  absl::StatusOr<uint8_t*> Allocate(size_t bytes) override {
    // Default-initialised: the generator writes every byte, no need to zero gigabytes first.
    buffers_.push_back(
        std::unique_ptr<uint8_t[]>(new (std::nothrow) uint8_t[std::max<size_t>(bytes, 1)]));
    if (buffers_.back() == nullptr) {
      buffers_.pop_back();
      return absl::ResourceExhaustedError(
          absl::StrCat("synthetic model: cannot allocate ", bytes, " bytes of host memory"));
    }
    return buffers_.back().get();
  }
  absl::Status Fill(const SyntheticTensor& tensor, int64_t first, int64_t count,
                    uint8_t* out) override {
    FillSyntheticElements(tensor, first, count, out);
    return absl::OkStatus();
  }

 private:
  std::vector<std::unique_ptr<uint8_t[]>> buffers_;
};

}  // namespace

absl::StatusOr<SyntheticShardBuilder> SyntheticShardBuilder::Create(const ModelConfig& config,
                                                                    const SyntheticWeights& weights,
                                                                    const ShardSpec& shard,
                                                                    SyntheticSliceWriter* writer) {
  std::vector<int> experts;
  FLOTILLA_RETURN_IF_ERROR(CheckShardSpec(config, shard, &experts));
  return SyntheticShardBuilder(config, weights, shard, std::move(experts), writer);
}

SyntheticShardBuilder::SyntheticShardBuilder(const ModelConfig& config,
                                             const SyntheticWeights& weights,
                                             const ShardSpec& shard, std::vector<int> experts,
                                             SyntheticSliceWriter* writer)
    : config_(config),
      weights_(weights),
      shard_(shard),
      experts_(std::move(experts)),
      writer_(writer) {
  for (TensorSpec& spec : ExpectedTensors(config)) specs_[spec.name] = std::move(spec);
}

absl::StatusOr<const uint8_t*> SyntheticShardBuilder::Slice(const std::string& name, int64_t first,
                                                            int64_t count) {
  auto it = specs_.find(name);
  if (it == specs_.end()) {
    return absl::InternalError(absl::StrCat("synthetic model: no tensor '", name, "'"));
  }
  const SyntheticTensor tensor = SyntheticTensorFor(config_, weights_, name, it->second.dtype);
  FLOTILLA_ASSIGN_OR_RETURN(
      uint8_t * out, writer_->Allocate(static_cast<size_t>(count * DTypeSize(tensor.dtype))));
  FLOTILLA_RETURN_IF_ERROR(writer_->Fill(tensor, first, count, out));
  return out;
}

absl::StatusOr<const uint16_t*> SyntheticShardBuilder::Bf16Slice(const std::string& name,
                                                                 int64_t first, int64_t count) {
  FLOTILLA_ASSIGN_OR_RETURN(const uint8_t* bytes, Slice(name, first, count));
  return reinterpret_cast<const uint16_t*>(bytes);
}

absl::StatusOr<Bf16Matrix> SyntheticShardBuilder::Rows(const std::string& name, int64_t row_begin,
                                                       int64_t rows, int64_t cols) {
  FLOTILLA_ASSIGN_OR_RETURN(const uint16_t* data, Bf16Slice(name, row_begin * cols, rows * cols));
  return Bf16Matrix{data, rows, cols, cols};
}

absl::StatusOr<Bf16Matrix> SyntheticShardBuilder::Columns(const std::string& name, int64_t rows,
                                                          int64_t total_cols, int64_t col_begin,
                                                          int64_t cols) {
  if (cols == total_cols) return Rows(name, 0, rows, cols);
  FLOTILLA_ASSIGN_OR_RETURN(uint8_t * out, writer_->Allocate(static_cast<size_t>(rows * cols * 2)));
  const SyntheticTensor tensor = SyntheticTensorFor(config_, weights_, name, DType::kBF16);
  for (int64_t r = 0; r < rows; ++r) {
    FLOTILLA_RETURN_IF_ERROR(
        writer_->Fill(tensor, r * total_cols + col_begin, cols, out + 2 * r * cols));
  }
  return Bf16Matrix{reinterpret_cast<const uint16_t*>(out), rows, cols, cols};
}

// Sinks are a handful of values the engines want as f32 on the host.
std::vector<float> SyntheticShardBuilder::Sinks(const std::string& name, int begin,
                                                int count) const {
  const DType dtype = specs_.at(name).dtype;
  const SyntheticTensor tensor = SyntheticTensorFor(config_, weights_, name, dtype);
  std::vector<float> out(count);
  if (dtype == DType::kF32) {
    FillSyntheticElements(tensor, begin, count, out.data());
    return out;
  }
  std::vector<uint16_t> bits(count);
  FillSyntheticElements(tensor, begin, count, bits.data());
  for (int h = 0; h < count; ++h) out[h] = Bf16ToFloat(bits[h]);
  return out;
}

absl::StatusOr<Bf16Matrix> SyntheticShardBuilder::Embedding() {
  return Rows("model.embed_tokens.weight", 0, config_.vocab_size, config_.hidden_size);
}

absl::StatusOr<Bf16Matrix> SyntheticShardBuilder::LmHead() {
  return Rows(config_.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight", 0,
              config_.vocab_size, config_.hidden_size);
}

absl::StatusOr<Bf16Vector> SyntheticShardBuilder::FinalNorm() {
  FLOTILLA_ASSIGN_OR_RETURN(const uint16_t* data,
                            Bf16Slice("model.norm.weight", 0, config_.hidden_size));
  return Bf16Vector{data, config_.hidden_size};
}

absl::Status SyntheticShardBuilder::Attention(int layer, AttentionWeights* a) {
  const int64_t H = config_.hidden_size, D = config_.head_dim;
  const int64_t NH = config_.num_attention_heads, NKV = config_.num_key_value_heads;
  a->q_heads = static_cast<int>(NH / shard_.tp_size);
  a->kv_heads = static_cast<int>(NKV / shard_.tp_size);
  a->q_head_begin = shard_.tp_rank * a->q_heads;
  a->kv_head_begin = shard_.tp_rank * a->kv_heads;
  auto name = [layer](const char* suffix) { return LayerTensorName(layer, suffix); };
  // Rows of q/k/v are contiguous per head: this rank's heads are a row range.
  auto heads = [&](const char* proj, int begin, int count, Bf16Matrix* w,
                   Bf16Vector* b) -> absl::Status {
    FLOTILLA_ASSIGN_OR_RETURN(*w, Rows(name(proj) + ".weight", begin * D, count * D, H));
    FLOTILLA_ASSIGN_OR_RETURN(b->data, Bf16Slice(name(proj) + ".bias", begin * D, count * D));
    b->size = count * D;
    return absl::OkStatus();
  };
  FLOTILLA_RETURN_IF_ERROR(heads("self_attn.q_proj", a->q_head_begin, a->q_heads, &a->wq, &a->bq));
  FLOTILLA_RETURN_IF_ERROR(
      heads("self_attn.k_proj", a->kv_head_begin, a->kv_heads, &a->wk, &a->bk));
  FLOTILLA_RETURN_IF_ERROR(
      heads("self_attn.v_proj", a->kv_head_begin, a->kv_heads, &a->wv, &a->bv));
  // o_proj consumes the concatenated heads: this rank's heads are a column range.
  FLOTILLA_ASSIGN_OR_RETURN(a->wo, Columns(name("self_attn.o_proj.weight"), H, NH * D,
                                           a->q_head_begin * D, a->q_heads * D));
  FLOTILLA_ASSIGN_OR_RETURN(a->bo.data, Bf16Slice(name("self_attn.o_proj.bias"), 0, H));
  a->bo.size = H;
  a->sinks = Sinks(name("self_attn.sinks"), a->q_head_begin, a->q_heads);
  return absl::OkStatus();
}

absl::StatusOr<ExpertWeights> SyntheticShardBuilder::Expert(int layer, int e) {
  const int64_t H = config_.hidden_size, I = config_.intermediate_size;
  auto name = [layer](const char* suffix) { return LayerTensorName(layer, suffix); };
  ExpertWeights x;
  x.expert_id = e;
  x.gate_up = Mxfp4Matrix{nullptr, nullptr, 2 * I, H};
  FLOTILLA_ASSIGN_OR_RETURN(x.gate_up.blocks, Slice(name("mlp.experts.gate_up_proj_blocks"),
                                                    e * 2 * I * H / 2, 2 * I * H / 2));
  FLOTILLA_ASSIGN_OR_RETURN(x.gate_up.scales, Slice(name("mlp.experts.gate_up_proj_scales"),
                                                    e * 2 * I * H / 32, 2 * I * H / 32));
  FLOTILLA_ASSIGN_OR_RETURN(x.gate_up_bias.data,
                            Bf16Slice(name("mlp.experts.gate_up_proj_bias"), e * 2 * I, 2 * I));
  x.gate_up_bias.size = 2 * I;
  x.down = Mxfp4Matrix{nullptr, nullptr, H, I};
  FLOTILLA_ASSIGN_OR_RETURN(x.down.blocks,
                            Slice(name("mlp.experts.down_proj_blocks"), e * H * I / 2, H * I / 2));
  FLOTILLA_ASSIGN_OR_RETURN(
      x.down.scales, Slice(name("mlp.experts.down_proj_scales"), e * H * I / 32, H * I / 32));
  FLOTILLA_ASSIGN_OR_RETURN(x.down_bias.data,
                            Bf16Slice(name("mlp.experts.down_proj_bias"), e * H, H));
  x.down_bias.size = H;
  return x;
}

absl::StatusOr<LayerWeights> SyntheticShardBuilder::Layer(int layer) {
  if (layer < 0 || layer >= config_.num_hidden_layers) {
    return absl::InvalidArgumentError(absl::StrCat("synthetic model: no layer ", layer));
  }
  const int64_t H = config_.hidden_size, E = config_.num_local_experts;
  auto name = [layer](const char* suffix) { return LayerTensorName(layer, suffix); };
  LayerWeights w;
  FLOTILLA_ASSIGN_OR_RETURN(w.input_norm.data, Bf16Slice(name("input_layernorm.weight"), 0, H));
  w.input_norm.size = H;
  FLOTILLA_ASSIGN_OR_RETURN(w.post_attn_norm.data,
                            Bf16Slice(name("post_attention_layernorm.weight"), 0, H));
  w.post_attn_norm.size = H;
  FLOTILLA_RETURN_IF_ERROR(Attention(layer, &w.attn));
  FLOTILLA_ASSIGN_OR_RETURN(w.router, Rows(name("mlp.router.weight"), 0, E, H));
  FLOTILLA_ASSIGN_OR_RETURN(w.router_bias.data, Bf16Slice(name("mlp.router.bias"), 0, E));
  w.router_bias.size = E;
  w.slot_of_expert.assign(E, -1);
  for (int e : experts_) {
    FLOTILLA_ASSIGN_OR_RETURN(ExpertWeights x, Expert(layer, e));
    w.slot_of_expert[e] = static_cast<int>(w.experts.size());
    w.experts.push_back(x);
  }
  return w;
}

absl::StatusOr<ModelWeights> MakeSyntheticShard(const ModelConfig& config,
                                                const SyntheticWeights& weights,
                                                const ShardSpec& shard) {
  auto writer = std::make_shared<HostSliceWriter>();
  FLOTILLA_ASSIGN_OR_RETURN(SyntheticShardBuilder builder,
                            SyntheticShardBuilder::Create(config, weights, shard, writer.get()));
  ModelWeights w;
  w.config = config;
  if (shard.load_embedding) {
    FLOTILLA_ASSIGN_OR_RETURN(w.embed, builder.Embedding());
  }
  if (shard.load_lm_head) {
    FLOTILLA_ASSIGN_OR_RETURN(w.lm_head, builder.LmHead());
  }
  FLOTILLA_ASSIGN_OR_RETURN(w.final_norm, builder.FinalNorm());
  for (int l = 0; l < config.num_hidden_layers; ++l) {
    FLOTILLA_ASSIGN_OR_RETURN(LayerWeights layer, builder.Layer(l));
    w.layers.push_back(std::move(layer));
  }
  w.keepalive = std::move(writer);
  return w;
}

}  // namespace flotilla
