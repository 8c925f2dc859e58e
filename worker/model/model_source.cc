#include "worker/model/model_source.h"

#include <utility>

#include "common/status.h"
#include "worker/model/demo_model.h"
#include "worker/model/load_weights.h"
#include "worker/model/synthetic_shard.h"

namespace flotilla {

absl::StatusOr<std::unique_ptr<ModelSource>> ModelSource::Open(const std::string& model) {
  std::unique_ptr<ModelSource> source(new ModelSource());
  source->model_ = model;
  std::string dir = model;
  if (IsSyntheticModel(model)) {
    FLOTILLA_ASSIGN_OR_RETURN(SyntheticModelSpec spec, ParseSyntheticModel(model));
    if (spec.preset != kDemoPreset) {
      source->synthetic_ = std::move(spec);
      source->config_ = source->synthetic_->config;
      return source;
    }
    // The trained demo model is a checkpoint like any other once expanded.
    FLOTILLA_ASSIGN_OR_RETURN(dir, DemoCheckpointDir());
  }
  FLOTILLA_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> checkpoint, Checkpoint::Open(dir));
  source->config_ = checkpoint->config();
  source->checkpoint_ = std::move(checkpoint);
  return source;
}

absl::StatusOr<ModelWeights> ModelSource::LoadShard(const ShardSpec& shard) const {
  if (synthetic_) return MakeSyntheticShard(synthetic_->config, synthetic_->weights(), shard);
  return LoadWeights(checkpoint_, shard);
}

uint64_t ShardProjectionBytes(const ModelConfig& c, const ShardSpec& shard) {
  const uint64_t tp = static_cast<uint64_t>(shard.tp_size > 0 ? shard.tp_size : 1);
  const uint64_t H = c.hidden_size, I = c.intermediate_size, D = c.head_dim;
  const uint64_t q_heads = c.num_attention_heads / tp, kv_heads = c.num_key_value_heads / tp;
  const uint64_t experts = shard.experts.empty() ? c.num_local_experts : shard.experts.size();
  const uint64_t attention = ((q_heads + 2 * kv_heads) * D * H + H * q_heads * D) * 2;
  const uint64_t expert = (2 * I * H + H * I) / 32 * 17;
  return c.num_hidden_layers * (attention + experts * expert);
}

}  // namespace flotilla
