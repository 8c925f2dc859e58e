#include "worker/engine/cpu_engine.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <unordered_set>

#include "absl/strings/str_cat.h"
#include "common/bf16.h"
#include "common/status.h"
#include "kernels/cpu/kv_fp8.h"
#include "kernels/cpu/mxfp8.h"
#include "kernels/cpu/ops.h"
#include "worker/engine/draft_verify.h"
#include "worker/engine/rope_params.h"
#include "worker/model/expert_slice.h"

namespace flotilla {
namespace {

namespace k = kernels::cpu;

absl::Status CheckMatrix(const Bf16Matrix& m, int64_t rows, int64_t cols, const std::string& what) {
  if (m.data == nullptr || m.rows != rows || m.cols != cols || m.row_stride < cols) {
    return absl::InvalidArgumentError(absl::StrCat("weights: ", what, " is [", m.rows, ", ",
                                                   m.cols, "] (data ",
                                                   m.data ? "set" : "missing", "), expected [",
                                                   rows, ", ", cols, "]"));
  }
  return absl::OkStatus();
}

absl::Status CheckVector(const Bf16Vector& v, int64_t size, const std::string& what) {
  if (v.data == nullptr || v.size != size) {
    return absl::InvalidArgumentError(absl::StrCat("weights: ", what, " has ", v.size,
                                                   " elements (data ", v.data ? "set" : "missing",
                                                   "), expected ", size));
  }
  return absl::OkStatus();
}

absl::Status CheckMxfp4(const Mxfp4Matrix& m, int64_t rows, int64_t cols, const std::string& what) {
  if (m.blocks == nullptr || m.scales == nullptr || m.rows != rows || m.cols != cols) {
    return absl::InvalidArgumentError(absl::StrCat("weights: ", what, " is [", m.rows, ", ",
                                                   m.cols, "], expected [", rows, ", ", cols,
                                                   "] with blocks and scales"));
  }
  return absl::OkStatus();
}

// Layer `l`'s norms and attention: a whole GQA group slice of heads, the
// same on every layer (every head without a context).
absl::Status CheckLayerAttention(const ModelWeights& w, int l, bool has_context) {
  const ModelConfig& c = w.config;
  const int64_t H = c.hidden_size, D = c.head_dim;
  const int group = c.num_attention_heads / c.num_key_value_heads;
  const LayerWeights& L = w.layers[l];
  const std::string p = absl::StrCat("model.layers.", l, ".");
  const AttentionWeights& a = L.attn;
  FLOTILLA_RETURN_IF_ERROR(CheckVector(L.input_norm, H, p + "input_layernorm.weight"));
  FLOTILLA_RETURN_IF_ERROR(CheckVector(L.post_attn_norm, H, p + "post_attention_layernorm.weight"));
  if (a.q_heads <= 0 || a.kv_heads <= 0 || a.q_heads != a.kv_heads * group ||
      a.q_head_begin != a.kv_head_begin * group ||
      a.q_head_begin + a.q_heads > c.num_attention_heads) {
    return absl::InvalidArgumentError(absl::StrCat(
        "weights: ", p, "self_attn holds q heads [", a.q_head_begin, ", +", a.q_heads,
        ") and kv heads [", a.kv_head_begin, ", +", a.kv_heads, "), not a whole GQA group slice"));
  }
  if (l > 0 &&
      (a.q_heads != w.layers[0].attn.q_heads || a.q_head_begin != w.layers[0].attn.q_head_begin)) {
    return absl::InvalidArgumentError("weights: every layer must hold the same attention heads");
  }
  if (!has_context && a.q_heads != c.num_attention_heads) {
    return absl::InvalidArgumentError(
        "weights: a single-rank engine needs every attention head (pass a ParallelContext for a "
        "shard)");
  }
  FLOTILLA_RETURN_IF_ERROR(CheckMatrix(a.wq, a.q_heads * D, H, p + "self_attn.q_proj.weight"));
  FLOTILLA_RETURN_IF_ERROR(CheckVector(a.bq, a.q_heads * D, p + "self_attn.q_proj.bias"));
  FLOTILLA_RETURN_IF_ERROR(CheckMatrix(a.wk, a.kv_heads * D, H, p + "self_attn.k_proj.weight"));
  FLOTILLA_RETURN_IF_ERROR(CheckVector(a.bk, a.kv_heads * D, p + "self_attn.k_proj.bias"));
  FLOTILLA_RETURN_IF_ERROR(CheckMatrix(a.wv, a.kv_heads * D, H, p + "self_attn.v_proj.weight"));
  FLOTILLA_RETURN_IF_ERROR(CheckVector(a.bv, a.kv_heads * D, p + "self_attn.v_proj.bias"));
  FLOTILLA_RETURN_IF_ERROR(CheckMatrix(a.wo, H, a.q_heads * D, p + "self_attn.o_proj.weight"));
  FLOTILLA_RETURN_IF_ERROR(CheckVector(a.bo, H, p + "self_attn.o_proj.bias"));
  if (static_cast<int>(a.sinks.size()) != a.q_heads) {
    return absl::InvalidArgumentError(absl::StrCat(
        "weights: ", p, "self_attn.sinks has ", a.sinks.size(), " values, expected ", a.q_heads));
  }
  return absl::OkStatus();
}

// Layer `l`'s router and the experts it holds (every expert without a
// context), each in the slot slot_of_expert names.
absl::Status CheckLayerMoe(const ModelWeights& w, int l, bool has_context) {
  const ModelConfig& c = w.config;
  const int64_t H = c.hidden_size, I = c.intermediate_size, E = c.num_local_experts;
  const LayerWeights& L = w.layers[l];
  const std::string p = absl::StrCat("model.layers.", l, ".");
  FLOTILLA_RETURN_IF_ERROR(CheckMatrix(L.router, E, H, p + "mlp.router.weight"));
  FLOTILLA_RETURN_IF_ERROR(CheckVector(L.router_bias, E, p + "mlp.router.bias"));
  if (static_cast<int64_t>(L.slot_of_expert.size()) != E) {
    return absl::InvalidArgumentError(
        absl::StrCat("weights: ", p, "slot_of_expert must have one entry per expert"));
  }
  for (int64_t e = 0; e < E; ++e) {
    const int slot = L.slot_of_expert[e];
    if (slot < 0) {
      if (!has_context) {
        return absl::InvalidArgumentError(absl::StrCat(
            "weights: ", p, "expert ", e, " is not held; a single-rank engine needs every expert"));
      }
      continue;
    }
    if (slot >= static_cast<int>(L.experts.size()) || L.experts[slot].expert_id != e) {
      return absl::InvalidArgumentError(
          absl::StrCat("weights: ", p, "expert ", e, " maps to a bad slot ", slot));
    }
    const ExpertWeights& x = L.experts[slot];
    const std::string ep = absl::StrCat(p, "mlp.experts[", e, "].");
    FLOTILLA_RETURN_IF_ERROR(CheckMxfp4(x.gate_up, 2 * I, H, ep + "gate_up_proj"));
    FLOTILLA_RETURN_IF_ERROR(CheckVector(x.gate_up_bias, 2 * I, ep + "gate_up_proj_bias"));
    FLOTILLA_RETURN_IF_ERROR(CheckMxfp4(x.down, H, I, ep + "down_proj"));
    FLOTILLA_RETURN_IF_ERROR(CheckVector(x.down_bias, H, ep + "down_proj_bias"));
  }
  return absl::OkStatus();
}

absl::Status CheckWeights(const ModelWeights& w, bool has_context) {
  const ModelConfig& c = w.config;
  const int64_t H = c.hidden_size, D = c.head_dim, I = c.intermediate_size;
  const int64_t E = c.num_local_experts;
  if (H <= 0 || D <= 0 || D % 2 != 0 || I <= 0 || H % 32 != 0 || I % 32 != 0 || E <= 0 ||
      c.num_experts_per_tok <= 0 || c.num_experts_per_tok > E || c.vocab_size <= 0 ||
      c.num_attention_heads <= 0 || c.num_key_value_heads <= 0 ||
      c.num_attention_heads % c.num_key_value_heads != 0) {
    return absl::InvalidArgumentError(
        "model config: hidden_size and intermediate_size must be positive multiples of 32, "
        "head_dim even, 0 < num_experts_per_tok <= num_local_experts, and "
        "num_attention_heads a multiple of num_key_value_heads");
  }
  if (static_cast<int>(c.layer_types.size()) != c.num_hidden_layers) {
    return absl::InvalidArgumentError("model config: layer_types must have one entry per layer");
  }
  if (static_cast<int>(w.layers.size()) != c.num_hidden_layers) {
    return absl::InvalidArgumentError(absl::StrCat("weights: ", w.layers.size(),
                                                   " layers loaded, config has ",
                                                   c.num_hidden_layers));
  }
  FLOTILLA_RETURN_IF_ERROR(CheckMatrix(w.embed, c.vocab_size, H, "model.embed_tokens.weight"));
  FLOTILLA_RETURN_IF_ERROR(CheckMatrix(w.lm_head, c.vocab_size, H, "lm_head.weight"));
  FLOTILLA_RETURN_IF_ERROR(CheckVector(w.final_norm, H, "model.norm.weight"));
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    FLOTILLA_RETURN_IF_ERROR(CheckLayerAttention(w, l, has_context));
    FLOTILLA_RETURN_IF_ERROR(CheckLayerMoe(w, l, has_context));
  }
  return absl::OkStatus();
}

// A context must fit the weights: host memory, the model's shapes, this
// rank's share of the heads, and every expert its map places here held.
absl::Status CheckContext(const ModelWeights& w, const parallel::ParallelContext& context) {
  const ModelConfig& c = w.config;
  const parallel::ContextOptions& o = context.options();
  if (o.memory != parallel::Memory::kHost || o.hidden != c.hidden_size ||
      o.top_k != c.num_experts_per_tok) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parallel context: the CPU engine needs host memory, hidden ", c.hidden_size, " and top_k ",
        c.num_experts_per_tok, "; got hidden ", o.hidden, " top_k ", o.top_k));
  }
  const ExpertMap& map = context.expert_map();
  if (map.num_layers() != c.num_hidden_layers || map.num_experts() != c.num_local_experts) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parallel context: the expert map has ", map.num_layers(), " layers of ", map.num_experts(),
        " experts, the model ", c.num_hidden_layers, " of ", c.num_local_experts));
  }
  const int tp = context.config().tp_size();
  const int tp_rank = context.config().tp_rank_of(context.rank());
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const AttentionWeights& a = w.layers[l].attn;
    if (a.q_heads * tp != c.num_attention_heads || a.q_head_begin != tp_rank * a.q_heads) {
      return absl::InvalidArgumentError(absl::StrCat(
          "weights: layer ", l, " holds q heads [", a.q_head_begin, ", +", a.q_heads, "); TP rank ",
          tp_rank, " of ", tp, " needs [", tp_rank * (c.num_attention_heads / tp), ", +",
          c.num_attention_heads / tp, ")"));
    }
    for (int e : map.ExpertsOnRank(l, context.rank())) {
      if (w.layers[l].slot_of_expert[e] < 0) {
        return absl::InvalidArgumentError(absl::StrCat("weights: the expert map places expert ", e,
                                                       " of layer ", l, " on rank ", context.rank(),
                                                       ", which does not hold it"));
      }
    }
  }
  return absl::OkStatus();
}

KvCacheOptions KvOptions(const ModelConfig& c, int64_t kv_heads, int64_t block_size,
                         int64_t num_blocks, bool prefix_cache, int64_t host_cache_bytes = 0) {
  KvCacheOptions o;
  o.prefix_cache = prefix_cache;
  o.host_cache_bytes = host_cache_bytes;
  for (int l = 0; l < c.num_hidden_layers; ++l) o.sliding.push_back(c.is_sliding(l));
  o.window = c.sliding_window;
  o.kv_heads = kv_heads;
  o.head_dim = c.head_dim;
  o.block_size = block_size;
  o.num_blocks = num_blocks;
  return o;
}

}  // namespace

int64_t CpuEngine::KvBlocksFor(const ModelConfig& config, int64_t kv_heads, int64_t block_size,
                               int64_t sequences, int64_t tokens, bool prefix_cache) {
  absl::StatusOr<std::unique_ptr<KvCache>> probe = KvCache::Create(
      KvOptions(config, kv_heads, block_size, 1, prefix_cache));
  if (!probe.ok()) return 0;
  return sequences * (*probe)->BlocksForLength(tokens);
}

absl::StatusOr<std::unique_ptr<CpuEngine>> CpuEngine::Create(ModelWeights weights,
                                                             const CpuEngineOptions& options,
                                                             kernels::cpu::ThreadPool* pool,
                                                             parallel::ParallelContext* context) {
  FLOTILLA_RETURN_IF_ERROR(CheckWeights(weights, context != nullptr));
  if (context != nullptr) FLOTILLA_RETURN_IF_ERROR(CheckContext(weights, *context));
  if (context != nullptr && context->config().moe_tp()) {
    const ParallelConfig& pc = context->config();
    weights = SliceExpertsForTp(std::move(weights), pc.tp_rank_of(context->rank()), pc.tp_size());
  }
  const ModelConfig& c = weights.config;
  FLOTILLA_ASSIGN_OR_RETURN(
      std::unique_ptr<KvCache> kv,
      KvCache::Create(KvOptions(
          c, weights.layers.empty() ? c.num_key_value_heads : weights.layers[0].attn.kv_heads,
          options.kv_block_size, options.kv_num_blocks, options.prefix_cache,
          options.kv_host_cache_bytes)));
  std::unique_ptr<CpuEngine> engine(
      new CpuEngine(std::move(weights), std::move(kv), pool, context));
  engine->record_margins_ = options.record_router_margins;
  engine->kv_cache_dtype_ = options.kv_cache_dtype;
  engine->moe_activation_ = options.moe_activation;
  engine->record_routing_ = options.record_routing;
  return engine;
}

CpuEngine::CpuEngine(ModelWeights weights, std::unique_ptr<KvCache> kv,
                     kernels::cpu::ThreadPool* pool, parallel::ParallelContext* context)
    : weights_(std::move(weights)), kv_(std::move(kv)), pool_(pool), context_(context) {
  const ModelConfig& c = weights_.config;
  expert_counts_.assign(static_cast<size_t>(c.num_hidden_layers) * c.num_local_experts, 0);
  inv_freq_ = k::YarnInvFreq(YarnParamsOf(c));
  rope_scaling_ = k::YarnAttentionScaling(c.rope_scaling.factor);
}

int64_t CpuEngine::NewSequence() { return kv_->CreateSequence(); }

absl::StatusOr<int64_t> CpuEngine::ForkSequence(int64_t sequence) {
  absl::StatusOr<int64_t> id = kv_->Fork(sequence);
  if (!id.ok()) return absl::InvalidArgumentError(absl::StrCat("unknown sequence ", sequence));
  return id;
}

int64_t CpuEngine::CachedPrefixLength(const std::vector<int32_t>& prompt,
                                      uint64_t cache_domain) const {
  const int64_t bs = kv_->options().block_size;
  if (prompt.size() < 2) return 0;
  return kv_->MatchPrefix(prompt, (static_cast<int64_t>(prompt.size()) - 1) / bs, cache_domain) *
         bs;
}

absl::StatusOr<int64_t> CpuEngine::NewSequenceWithPrefix(const std::vector<int32_t>& prefix,
                                                         uint64_t cache_domain) {
  return kv_->CreateSequenceFromPrefix(prefix, cache_domain);
}

int64_t CpuEngine::MaxSequenceLength() const {
  return std::min<int64_t>(weights_.config.max_position_embeddings, kv_->MaxTokens());
}

absl::Status CpuEngine::Validate(const std::vector<StepItem>& items) const {
  // An empty step is how a rank with no work joins its peers' collectives.
  if (items.empty() && context_ == nullptr) {
    return absl::InvalidArgumentError("step: no sequences");
  }
  FLOTILLA_RETURN_IF_ERROR(CheckGroupLogits(items, SplitsGroupLogits()));
  const ModelConfig& c = weights_.config;
  std::unordered_set<int64_t> seen;
  int64_t needed = 0;
  for (const StepItem& it : items) {
    FLOTILLA_RETURN_IF_ERROR(
        CheckStepItem(it, kv_->Contains(it.sequence), c.vocab_size, &seen, VerifiesDrafts()));
    FLOTILLA_RETURN_IF_ERROR(CheckAcceptedDraft(it, drafts_));
    if (it.return_hidden && capture_layers_.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "step: sequence ", it.sequence,
          " asks for hidden states, but the engine captures no layer (SetHiddenCapture)"));
    }
    if (it.draft_tokens > 0 && c.sliding_window > 0 &&
        static_cast<int64_t>(it.tokens.size()) > c.sliding_window - 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("step: sequence ", it.sequence, " brings a drafted chunk of ",
                       it.tokens.size(), " tokens; with a sliding window of ", c.sliding_window,
                       " it may have at most ", c.sliding_window - 1));
    }
    const int64_t added = static_cast<int64_t>(it.accepted_draft.size() + it.tokens.size());
    const int64_t length = *kv_->Length(it.sequence) + added;
    if (length > c.max_position_embeddings) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sequence ", it.sequence, " would hold ", length,
          " tokens, more than the context (max_position_embeddings ", c.max_position_embeddings,
          ")"));
    }
    if (kv_->BlocksForLength(length) > kv_->num_blocks()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sequence ", it.sequence, " would hold ", length,
          " tokens, more than the KV cache can hold (", kv_->MaxTokens(), " tokens in ",
          kv_->num_blocks(), " blocks)"));
    }
    FLOTILLA_ASSIGN_OR_RETURN(int64_t n, kv_->BlocksNeeded(it.sequence, added));
    needed += n;
  }
  if (needed > kv_->free_blocks()) {
    return absl::ResourceExhaustedError(absl::StrCat("kv cache: out of blocks: the step needs ",
                                                     needed, " blocks, ", kv_->free_blocks(),
                                                     " of ", kv_->num_blocks(), " are free"));
  }
  return absl::OkStatus();
}

absl::StatusOr<StepOutput> CpuEngine::Step(const std::vector<StepItem>& items) {
  FLOTILLA_RETURN_IF_ERROR(Validate(items));
  const ModelConfig& c = weights_.config;
  const int64_t H = c.hidden_size;
  FLOTILLA_RETURN_IF_ERROR(ReserveStep(items));
  std::vector<int64_t> offsets(items.size() + 1, 0);
  for (size_t i = 0; i < items.size(); ++i) offsets[i + 1] = offsets[i] + items[i].tokens.size();
  const int64_t T = offsets.back();
  positions_.resize(T);
  std::vector<int32_t> ids(T);
  for (size_t i = 0; i < items.size(); ++i) {
    const int64_t start = *kv_->Length(items[i].sequence);
    for (size_t j = 0; j < items[i].tokens.size(); ++j) {
      positions_[offsets[i] + j] = start + static_cast<int64_t>(j);
      ids[offsets[i] + j] = items[i].tokens[j];
    }
  }
  if (record_margins_) margins_.assign(T, std::numeric_limits<float>::infinity());
  if (record_routing_) routing_.assign(T * c.num_hidden_layers * c.num_experts_per_tok, -1);
  FLOTILLA_RETURN_IF_ERROR(PrepareForcedRouting(items, offsets));
  x_.resize(T * H);
  k::EmbeddingGather(weights_.embed.data, weights_.embed.row_stride, H, ids.data(), T, x_.data());
  std::vector<std::vector<float>> hidden(items.size());
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    FLOTILLA_RETURN_IF_ERROR(RunLayer(l, items, offsets, T));
    CaptureHidden(l, items, offsets, &hidden);
  }
  StepOutput out;
  out.hidden = std::move(hidden);
  out.logits.resize(items.size());
  out.sampled.resize(items.size());
  out.accepted.resize(items.size());
  if (!forced_routing_.empty()) {
    out.routing_regret = regret_;
    forced_routing_.clear();
  }
  if (record_margins_) {
    for (size_t i = 0; i < items.size(); ++i) {
      out.router_margins.emplace_back(margins_.begin() + offsets[i],
                                      margins_.begin() + offsets[i + 1]);
    }
  }
  if (record_routing_) {
    const int64_t per_token = static_cast<int64_t>(c.num_hidden_layers) * c.num_experts_per_tok;
    for (size_t i = 0; i < items.size(); ++i) {
      out.routing.emplace_back(routing_.begin() + offsets[i] * per_token,
                               routing_.begin() + offsets[i + 1] * per_token);
    }
  }
  FinalRows(items, offsets, &out);
  FLOTILLA_RETURN_IF_ERROR(CommitStep(items));
  return out;
}

absl::Status CpuEngine::SetHiddenCapture(std::vector<int> layers) {
  for (int l : layers) {
    if (l < 0 || l >= weights_.config.num_hidden_layers) {
      return absl::InvalidArgumentError(absl::StrCat("hidden-state capture: layer ", l,
                                                     " is not in the model's 0..",
                                                     weights_.config.num_hidden_layers - 1));
    }
  }
  capture_layers_ = std::move(layers);
  return absl::OkStatus();
}

void CpuEngine::CaptureHidden(int layer, const std::vector<StepItem>& items,
                              const std::vector<int64_t>& offsets,
                              std::vector<std::vector<float>>* hidden) const {
  const int64_t H = weights_.config.hidden_size;
  const int64_t C = static_cast<int64_t>(capture_layers_.size());
  for (int64_t c = 0; c < C; ++c) {
    if (capture_layers_[c] != layer) continue;
    for (size_t i = 0; i < items.size(); ++i) {
      if (!items[i].return_hidden) continue;
      const int64_t n = offsets[i + 1] - offsets[i];
      std::vector<float>& rows = (*hidden)[i];
      rows.resize(n * C * H);
      for (int64_t j = 0; j < n; ++j) {
        std::memcpy(&rows[(j * C + c) * H], &x_[(offsets[i] + j) * H], H * sizeof(float));
      }
    }
  }
}

absl::Status CpuEngine::ReserveStep(const std::vector<StepItem>& items) {
  for (const StepItem& it : items) {
    // The accepted positions were written by the drafting step: they are
    // reserved already and only become part of the sequence.
    if (!it.accepted_draft.empty()) {
      FLOTILLA_RETURN_IF_ERROR(kv_->Commit(it.sequence, it.accepted_draft));
    }
    drafts_.erase(it.sequence);
    FLOTILLA_RETURN_IF_ERROR(kv_->Reserve(it.sequence, static_cast<int64_t>(it.tokens.size())));
  }
  return absl::OkStatus();
}

absl::Status CpuEngine::CommitStep(const std::vector<StepItem>& items) {
  for (const StepItem& it : items) {
    const size_t kept = it.tokens.size() - static_cast<size_t>(it.draft_tokens);
    FLOTILLA_RETURN_IF_ERROR(kv_->Commit(it.sequence, absl::MakeConstSpan(it.tokens.data(), kept)));
    if (it.draft_tokens > 0) drafts_[it.sequence].assign(it.tokens.begin() + kept, it.tokens.end());
  }
  return absl::OkStatus();
}

absl::Status CpuEngine::PrepareForcedRouting(const std::vector<StepItem>& items,
                                             const std::vector<int64_t>& offsets) {
  if (forced_routing_.empty()) return absl::OkStatus();
  const ModelConfig& c = weights_.config;
  const int64_t T = offsets.back();
  const int64_t per_token = static_cast<int64_t>(c.num_hidden_layers) * c.num_experts_per_tok;
  if (forced_routing_.size() != items.size()) {
    forced_routing_.clear();
    return absl::InvalidArgumentError("forced routing: one entry per item is needed");
  }
  token_item_.resize(T);
  for (size_t i = 0; i < items.size(); ++i) {
    if (static_cast<int64_t>(forced_routing_[i].size()) !=
        static_cast<int64_t>(items[i].tokens.size()) * per_token) {
      forced_routing_.clear();
      return absl::InvalidArgumentError("forced routing: [tokens][layers][K] per item");
    }
    for (int32_t e : forced_routing_[i]) {
      if (e < 0 || e >= c.num_local_experts) {
        forced_routing_.clear();
        return absl::InvalidArgumentError("forced routing: expert id out of range");
      }
    }
    for (int64_t t = offsets[i]; t < offsets[i + 1]; ++t) token_item_[t] = static_cast<int64_t>(i);
  }
  regret_.assign(items.size(), 0.0f);
  return absl::OkStatus();
}

void CpuEngine::FinalRows(const std::vector<StepItem>& items, const std::vector<int64_t>& offsets,
                          StepOutput* out) {
  const ModelConfig& c = weights_.config;
  const int64_t H = c.hidden_size, V = c.vocab_size;
  // Final norm and lm_head on the rows asked for.
  std::vector<int64_t> rows;
  std::vector<int64_t> first_row(items.size()), row_count(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    first_row[i] = static_cast<int64_t>(rows.size());
    const int64_t n = static_cast<int64_t>(items[i].tokens.size());
    if (items[i].logits == LogitsMode::kAll) {
      for (int64_t j = 0; j < n; ++j) rows.push_back(offsets[i] + j);
    } else if (items[i].logits == LogitsMode::kLast || items[i].sampler != nullptr) {
      for (int64_t j = n - 1 - items[i].draft_tokens; j < n; ++j) rows.push_back(offsets[i] + j);
    }
    row_count[i] = static_cast<int64_t>(rows.size()) - first_row[i];
  }
  if (!rows.empty()) {
    const int64_t R = static_cast<int64_t>(rows.size());
    t_.resize(R * H);
    for (int64_t r = 0; r < R; ++r) {
      std::memcpy(&t_[r * H], &x_[rows[r] * H], H * sizeof(float));
    }
    k::RmsNorm(t_.data(), weights_.final_norm.data, R, H, static_cast<float>(c.rms_norm_eps),
               t_.data());
    std::vector<float> logits(R * V);
    k::LinearBf16(pool_, t_.data(), R, H, weights_.lm_head.data, weights_.lm_head.row_stride, V,
                  nullptr, logits.data());
    for (size_t i = 0; i < items.size(); ++i) {
      const int64_t draft = items[i].draft_tokens;
      const float* verified = logits.data() + (first_row[i] + row_count[i] - 1 - draft) * V;
      if (items[i].sampler != nullptr) {
        const std::vector<int32_t>& tokens = items[i].tokens;
        VerifiedDraft v = VerifyDraft(*items[i].sampler, verified, V,
                                      absl::MakeConstSpan(tokens).subspan(tokens.size() - draft));
        out->sampled[i] = std::move(v.next);
        out->accepted[i] = std::move(v.accepted);
      }
      if (items[i].logits == LogitsMode::kNone) continue;
      out->logits[i].assign(logits.begin() + first_row[i] * V,
                            logits.begin() + (first_row[i] + row_count[i]) * V);
    }
  }
}

absl::Status CpuEngine::RunLayer(int layer, const std::vector<StepItem>& items,
                                 const std::vector<int64_t>& offsets, int64_t T) {
  FLOTILLA_RETURN_IF_ERROR(RunAttention(layer, items, offsets, T));
  RunRouter(layer, offsets, T);
  return RunMoe(layer, T);
}

absl::Status CpuEngine::RunAttention(int layer, const std::vector<StepItem>& items,
                                     const std::vector<int64_t>& offsets, int64_t T) {
  const ModelConfig& c = weights_.config;
  const LayerWeights& L = weights_.layers[layer];
  const AttentionWeights& a = L.attn;
  const int64_t H = c.hidden_size, D = c.head_dim;
  const int64_t qd = a.q_heads * D, kvd = a.kv_heads * D;
  const float eps = static_cast<float>(c.rms_norm_eps);

  // Attention over the heads this rank holds.
  t_.resize(T * H);
  k::RmsNorm(x_.data(), L.input_norm.data, T, H, eps, t_.data());
  q_.resize(T * qd);
  k_.resize(T * kvd);
  v_.resize(T * kvd);
  k::LinearBf16(pool_, t_.data(), T, H, a.wq.data, a.wq.row_stride, qd, a.bq.data, q_.data());
  k::LinearBf16(pool_, t_.data(), T, H, a.wk.data, a.wk.row_stride, kvd, a.bk.data, k_.data());
  k::LinearBf16(pool_, t_.data(), T, H, a.wv.data, a.wv.row_stride, kvd, a.bv.data, v_.data());
  k::ApplyRope(q_.data(), T, a.q_heads, D, positions_.data(), inv_freq_.data(), rope_scaling_);
  k::ApplyRope(k_.data(), T, a.kv_heads, D, positions_.data(), inv_freq_.data(), rope_scaling_);
  const int64_t window = c.is_sliding(layer) ? c.sliding_window : 0;
  if (kv_cache_dtype_ == KvCacheDtype::kFp8 && window == 0) {
    // An FP8 cache gives back the new keys and values (this step's queries
    // read them from it too) through e4m3 and a scale per (position, head).
    for (int64_t r = 0; r < T * a.kv_heads; ++r) {
      k::RoundTripKvHead(k_.data() + r * D, D);
      k::RoundTripKvHead(v_.data() + r * D, D);
    }
  }
  attn_.resize(T * qd);
  std::vector<k::AttentionItem> att(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    k::AttentionItem& it = att[i];
    it.cache = kv_->View(items[i].sequence, layer);
    it.q = q_.data() + offsets[i] * qd;
    it.k_new = k_.data() + offsets[i] * kvd;
    it.v_new = v_.data() + offsets[i] * kvd;
    it.num_new = offsets[i + 1] - offsets[i];
    it.start_pos = positions_[offsets[i]];
    it.out = attn_.data() + offsets[i] * qd;
  }
  if (!k::Attention(pool_, att.data(), static_cast<int64_t>(att.size()), a.q_heads, a.kv_heads,
                    D, a.sinks.data(), window, 1.0f / std::sqrt(static_cast<float>(D)))) {
    return absl::InternalError(absl::StrCat("layer ", layer, ": KV cache lost a needed position"));
  }
  for (size_t i = 0; i < items.size(); ++i) {
    for (int64_t t = offsets[i]; t < offsets[i + 1]; ++t) {
      if (float* kr = kv_->KeyRow(items[i].sequence, layer, positions_[t])) {
        std::memcpy(kr, &k_[t * kvd], kvd * sizeof(float));
        std::memcpy(kv_->ValueRow(items[i].sequence, layer, positions_[t]), &v_[t * kvd],
                    kvd * sizeof(float));
      }
    }
  }
  o_.resize(T * H);
  k::LinearBf16(pool_, attn_.data(), T, qd, a.wo.data, a.wo.row_stride, H, nullptr, o_.data());
  // o_proj's bias joins the partial sum on exactly one rank of the TP group.
  if (a.q_head_begin == 0) {
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t h = 0; h < H; ++h) o_[t * H + h] += Bf16ToFloat(a.bo.data[h]);
    }
  }
  if (context_ != nullptr) {
    FLOTILLA_RETURN_IF_ERROR(context_->tp().AllReduce(o_.data(), T * H));
  }
  for (int64_t i = 0; i < T * H; ++i) x_[i] += o_[i];
  return absl::OkStatus();
}

void CpuEngine::RunRouter(int layer, const std::vector<int64_t>& offsets, int64_t T) {
  const ModelConfig& c = weights_.config;
  const LayerWeights& L = weights_.layers[layer];
  const int64_t H = c.hidden_size;
  // Router on the full hidden state (the experts this rank holds follow).
  k::RmsNorm(x_.data(), L.post_attn_norm.data, T, H, static_cast<float>(c.rms_norm_eps), t_.data());
  const int64_t E = c.num_local_experts, K = c.num_experts_per_tok;
  router_.resize(T * E);
  k::LinearBf16(pool_, t_.data(), T, H, L.router.data, L.router.row_stride, E,
                L.router_bias.data, router_.data());
  topk_idx_.resize(T * K);
  topk_w_.resize(T * K);
  k::RouterTopK(router_.data(), T, E, K, topk_idx_.data(), topk_w_.data());
  if (!forced_routing_.empty()) ForceRouting(layer, offsets, T);
  if (record_margins_ && K < E) RecordMargins(T);
  if (record_routing_) {
    for (int64_t t = 0; t < T; ++t) {
      std::copy(topk_idx_.begin() + t * K, topk_idx_.begin() + (t + 1) * K,
                routing_.begin() + (t * c.num_hidden_layers + layer) * K);
    }
  }
}

void CpuEngine::ForceRouting(int layer, const std::vector<int64_t>& offsets, int64_t T) {
  const ModelConfig& c = weights_.config;
  const int64_t E = c.num_local_experts, K = c.num_experts_per_tok;
  const int layers = c.num_hidden_layers;
  for (int64_t t = 0; t < T; ++t) {
    const int64_t item = token_item_[t];
    const int64_t j = t - offsets[item];
    const int32_t* f = forced_routing_[item].data() + (j * layers + layer) * K;
    const float* r = &router_[t * E];
    float kth = std::numeric_limits<float>::infinity(), top = -kth, fmax = -kth;
    for (int64_t k = 0; k < K; ++k) {
      kth = std::min(kth, r[topk_idx_[t * K + k]]);
      top = std::max(top, r[topk_idx_[t * K + k]]);
      fmax = std::max(fmax, r[f[k]]);
    }
    float sum = 0;
    for (int64_t k = 0; k < K; ++k) {
      regret_[item] = std::max(regret_[item], (kth - r[f[k]]) / std::max(1.0f, std::abs(top)));
      topk_idx_[t * K + k] = f[k];
      topk_w_[t * K + k] = std::exp(r[f[k]] - fmax);
      sum += topk_w_[t * K + k];
    }
    for (int64_t k = 0; k < K; ++k) topk_w_[t * K + k] /= sum;
  }
}

void CpuEngine::RecordMargins(int64_t T) {
  const ModelConfig& c = weights_.config;
  const int64_t E = c.num_local_experts, K = c.num_experts_per_tok;
  std::vector<float> r(E);
  for (int64_t t = 0; t < T; ++t) {
    std::copy(router_.begin() + t * E, router_.begin() + (t + 1) * E, r.begin());
    std::nth_element(r.begin(), r.begin() + K, r.end(), std::greater<float>());
    const float next = r[K];
    const float kth = *std::min_element(r.begin(), r.begin() + K);
    const float top = *std::max_element(r.begin(), r.begin() + K);
    margins_[t] = std::min(margins_[t], (kth - next) / std::max(1.0f, std::abs(top)));
  }
}

absl::Status CpuEngine::RunMoe(int layer, int64_t T) {
  const int64_t H = weights_.config.hidden_size;
  if (context_ != nullptr && !context_->config().moe_tp()) {
    FLOTILLA_RETURN_IF_ERROR(RunDispatchedExperts(layer, T));
  } else {
    RunExperts(layer, T);
    // The tensor-parallel MoE: each rank ran its slice of every expert.
    if (context_ != nullptr) FLOTILLA_RETURN_IF_ERROR(context_->tp().AllReduce(y_.data(), T * H));
  }
  for (int64_t i = 0; i < T * H; ++i) x_[i] += y_[i];
  return absl::OkStatus();
}

void CpuEngine::RunExpert(const ExpertWeights& x, int64_t n) {
  const ModelConfig& c = weights_.config;
  // I of the expert held: the model's, or a TP rank's slice of it.
  const int64_t H = c.hidden_size, I = x.down.cols;
  const bool fp8 = moe_activation_ == MoeActivation::kFp8;
  if (fp8) k::RoundTripMxfp8Rows(ex_in_.data(), n, H);
  ex_gu_.resize(n * 2 * I);
  k::LinearMxfp4(pool_, ex_in_.data(), n, H, x.gate_up.blocks, x.gate_up.scales, 2 * I,
                 x.gate_up_bias.data, ex_gu_.data());
  ex_act_.resize(n * I);
  k::SwigluClamped(ex_gu_.data(), n, I, static_cast<float>(c.swiglu_limit), 1.702f, ex_act_.data());
  if (fp8) k::RoundTripMxfp8Rows(ex_act_.data(), n, I);
  ex_out_.resize(n * H);
  k::LinearMxfp4(pool_, ex_act_.data(), n, I, x.down.blocks, x.down.scales, H, x.down_bias.data,
                 ex_out_.data());
}

void CpuEngine::RunExperts(int layer, int64_t T) {
  const ModelConfig& c = weights_.config;
  const LayerWeights& L = weights_.layers[layer];
  const int64_t H = c.hidden_size;
  const int64_t E = c.num_local_experts, K = c.num_experts_per_tok;
  y_.assign(T * H, 0.0f);
  // Tokens routed to each expert, in token order.
  std::vector<std::vector<std::pair<int64_t, float>>> routed(E);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t s = 0; s < K; ++s) {
      routed[topk_idx_[t * K + s]].emplace_back(t, topk_w_[t * K + s]);
    }
  }
  // Ascending expert order, as transformers accumulates; the host context's
  // Combine sums in the same order, so several ranks give the same bits.
  for (int64_t e = 0; e < E; ++e) {
    const auto& toks = routed[e];
    if (toks.empty()) continue;
    const int64_t n = static_cast<int64_t>(toks.size());
    ex_in_.resize(n * H);
    for (int64_t i = 0; i < n; ++i) {
      std::memcpy(&ex_in_[i * H], &t_[toks[i].first * H], H * sizeof(float));
    }
    RunExpert(L.experts[L.slot_of_expert[e]], n);
    expert_counts_[layer * E + e] += n;
    for (int64_t i = 0; i < n; ++i) {
      float* yr = &y_[toks[i].first * H];
      const float* er = &ex_out_[i * H];
      const float w = toks[i].second;
      for (int64_t h = 0; h < H; ++h) yr[h] += er[h] * w;
    }
  }
}

absl::Status CpuEngine::RunDispatchedExperts(int layer, int64_t T) {
  parallel::ExpertParallel& ep = context_->ep();
  FLOTILLA_ASSIGN_OR_RETURN(parallel::ExpertRows rows,
                            ep.Dispatch(layer, t_.data(), topk_idx_.data(), topk_w_.data(), T));
  FLOTILLA_RETURN_IF_ERROR(RunHeldExperts(layer, rows));
  y_.resize(T * weights_.config.hidden_size);
  return ep.Combine(layer, y_.data());
}

absl::Status CpuEngine::RunHeldExperts(int layer, const parallel::ExpertRows& rows) {
  const LayerWeights& L = weights_.layers[layer];
  const int64_t H = weights_.config.hidden_size;
  // Rows name experts by their slot in the expert map; the weights keep
  // their own order (the shard's), so translate through the expert id.
  const ExpertMap& map = context_->expert_map();
  std::vector<int> held(map.SlotsOnRank(layer, context_->rank()), -1);
  for (int e = 0; e < map.num_experts(); ++e) {
    for (const ExpertLocation& at : map.replicas(layer, e)) {
      if (at.rank == context_->rank()) held[at.slot] = L.slot_of_expert[e];
    }
  }
  // Rows grouped by expert so each expert's weights stream once.
  std::vector<std::vector<int64_t>> routed(L.experts.size());
  for (int64_t i = 0; i < rows.rows; ++i) {
    const int32_t slot = rows.slot[i];
    const int local = slot >= 0 && slot < static_cast<int32_t>(held.size()) ? held[slot] : -1;
    if (local < 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("layer ", layer, ": slot ", slot, " names no expert this rank holds"));
    }
    routed[local].push_back(i);
  }
  const float* x = static_cast<const float*>(rows.x);
  for (size_t local = 0; local < routed.size(); ++local) {
    const std::vector<int64_t>& idx = routed[local];
    if (idx.empty()) continue;
    const int64_t n = static_cast<int64_t>(idx.size());
    ex_in_.resize(n * H);
    for (int64_t i = 0; i < n; ++i) std::memcpy(&ex_in_[i * H], x + idx[i] * H, H * sizeof(float));
    RunExpert(L.experts[local], n);
    expert_counts_[layer * weights_.config.num_local_experts + L.experts[local].expert_id] += n;
    for (int64_t i = 0; i < n; ++i) {
      std::memcpy(rows.out + idx[i] * H, &ex_out_[i * H], H * sizeof(float));
    }
  }
  return absl::OkStatus();
}

}  // namespace flotilla

namespace flotilla {

std::vector<uint64_t> CpuEngine::TakeExpertCounts() {
  const ModelConfig& c = weights_.config;
  std::vector<uint64_t> out(static_cast<size_t>(c.num_hidden_layers) * c.num_local_experts, 0);
  out.swap(expert_counts_);
  return out;
}

// The CPU engine runs a slot's expert through its id (RunHeldExperts), so
// slots need no weights of their own and `next` needs no checks here.
absl::Status CpuEngine::InstallExperts(const ExpertMap& /*next*/, ModelWeights extra) {
  const ModelConfig& c = weights_.config;
  if (static_cast<int>(extra.layers.size()) != c.num_hidden_layers) {
    return absl::InvalidArgumentError(absl::StrCat("InstallExperts: ", extra.layers.size(),
                                                   " layers, the model has ", c.num_hidden_layers));
  }
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    LayerWeights& L = weights_.layers[l];
    for (const ExpertWeights& x : extra.layers[l].experts) {
      if (x.expert_id < 0 || x.expert_id >= c.num_local_experts) {
        return absl::InvalidArgumentError(absl::StrCat("InstallExperts: no expert ", x.expert_id));
      }
      if (L.slot_of_expert[x.expert_id] >= 0) continue;
      L.slot_of_expert[x.expert_id] = static_cast<int>(L.experts.size());
      L.experts.push_back(x);
    }
  }
  installed_.push_back(std::move(extra.keepalive));
  return absl::OkStatus();
}

}  // namespace flotilla
