#include "worker/engine/cuda_layer_stages.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/attention_generic.h"
#include "kernels/cuda/ep_exchange.h"
#include "kernels/cuda/expert_count.h"
#include "kernels/cuda/kv_quant.h"
#include "kernels/cuda/l2_prefetch.h"
#include "kernels/cuda/moe.h"
#include "kernels/cuda/ops.h"
#include "worker/parallel/parallel_context.h"

namespace flotilla {
namespace {

namespace kc = kernels::cuda;

}  // namespace

OpMarks::~OpMarks() {
  for (auto& [label, event] : marks_) cudaEventDestroy(event);
}

absl::Status OpMarks::Mark(const char* label, cudaStream_t stream) {
  if (!on_) return absl::OkStatus();
  cudaEvent_t event = nullptr;
  FLOTILLA_CUDA_RETURN(cudaEventCreate(&event));
  marks_.emplace_back(label, event);
  return CudaStatus(cudaEventRecord(event, stream), "profile event");
}

absl::Status OpMarks::AddTimes(std::map<std::string, double>* op_time_ms) const {
  for (size_t i = 0; i + 1 < marks_.size(); ++i) {
    float ms = 0;
    FLOTILLA_CUDA_RETURN(cudaEventElapsedTime(&ms, marks_[i].second, marks_[i + 1].second));
    (*op_time_ms)[marks_[i].first] += ms;
  }
  return absl::OkStatus();
}

LayerStages::LayerStages(CudaDeviceState& d, const ModelConfig& config,
                         const CudaEngineOptions& options, const StepLayout& plan, SampleFn sample,
                         OpMarks* marks)
    : d_(d),
      c_(config),
      options_(options),
      plan_(plan),
      sample_(std::move(sample)),
      marks_(marks),
      par_(options.parallel) {
  tp_ = par_ != nullptr ? par_->config().tp_size() : 1;
  moe_tp_ = par_ != nullptr && par_->config().moe_tp();
  deterministic_ = options_.deterministic;
  // This rank's heads (all of them without tensor parallelism).
  H_ = c_.hidden_size;
  D_ = c_.head_dim;
  NH_ = c_.num_attention_heads / tp_;
  E_ = c_.num_local_experts;
  K_ = c_.num_experts_per_tok;
  V_ = c_.vocab_size;
  QKV_ = (NH_ + 2 * c_.num_key_value_heads / tp_) * D_;
  T_ = plan.tokens;
  eps_ = static_cast<float>(c_.rms_norm_eps);
  batch_.max_blocks_per_seq = d.meta_at.max_blocks_per_seq;
  batch_.seq_lens = d.meta + d.meta_at.lens;
  batch_.q_start = d.meta + d.meta_at.qstart;
  batch_.batch = plan.seqs;
  batch_.total_q = T_;
  batch_.max_q_per_seq = plan.max_q;
  prefetch_ = T_ > 0 && T_ <= options_.l2_prefetch_max_tokens && d.prefetch_stream != nullptr;
  prefetch_next_qkv_ = prefetch_ && T_ <= options_.l2_prefetch_next_qkv_max_tokens;
}

bool LayerStages::On(const char* op) const {
  return std::find(options_.skip_ops.begin(), options_.skip_ops.end(), op) ==
         options_.skip_ops.end();
}

absl::Status LayerStages::Forward(int64_t ctx, int logit_rows, int row_offset) {
  batch_.max_seq_len = static_cast<int>(ctx);
  FLOTILLA_RETURN_IF_ERROR(Mark("embedding"));
  if (T_ == 0) {
    FLOTILLA_RETURN_IF_ERROR(JoinExchanges());
    return Mark("end");
  }
  if (On("embedding")) {
    FLOTILLA_CUDA_RETURN(kc::LaunchEmbedding(d_.embed, V_, H_, d_.meta + d_.meta_at.tokens, T_,
                                             d_.x, d_.invalid, d_.stream));
  }
  for (int l = 0; l < static_cast<int>(d_.layers.size()); ++l) {
    FLOTILLA_RETURN_IF_ERROR(AttentionBlock(l));
    if (prefetch_next_qkv_ && l + 1 < static_cast<int>(d_.layers.size())) {
      FLOTILLA_RETURN_IF_ERROR(
          Prefetch(d_.layers[l + 1].wqkv, static_cast<size_t>(QKV_) * H_ * sizeof(uint16_t)));
    }
    FLOTILLA_RETURN_IF_ERROR(Router(l));
    FLOTILLA_RETURN_IF_ERROR(Moe(l));
    FLOTILLA_RETURN_IF_ERROR(CaptureHidden(l));
  }
  FLOTILLA_RETURN_IF_ERROR(JoinPrefetches());
  if (logit_rows > 0) FLOTILLA_RETURN_IF_ERROR(Logits(logit_rows, row_offset));
  return Mark("end");
}

absl::Status LayerStages::CaptureHidden(int layer) {
  if (!d_.capture_step) return absl::OkStatus();
  const size_t layer_stride = static_cast<size_t>(d_.max_tokens) * H_;
  for (size_t c = 0; c < d_.capture_layers.size(); ++c) {
    if (d_.capture_layers[c] != layer) continue;
    FLOTILLA_CUDA_RETURN(cudaMemcpyAsync(d_.hidden_host + c * layer_stride, d_.x,
                                         static_cast<size_t>(T_) * H_ * sizeof(float),
                                         cudaMemcpyDeviceToHost, d_.stream));
  }
  return absl::OkStatus();
}

absl::Status LayerStages::JoinExchanges() {
  // A sharded rank with no tokens still takes part in every exchange (the
  // tensor-parallel MoE has none beyond its idle TP group's).
  for (size_t l = 0; l < d_.layers.size() && !moe_tp_; ++l) {
    FLOTILLA_RETURN_IF_ERROR(ExpertParallelMoe(static_cast<int>(l), 0));
  }
  return absl::OkStatus();
}

absl::Status LayerStages::Prefetch(const void* p, size_t bytes) {
  if (!prefetch_) return absl::OkStatus();
  FLOTILLA_CUDA_RETURN(cudaEventRecord(d_.prefetch_fork, d_.stream));
  FLOTILLA_CUDA_RETURN(cudaStreamWaitEvent(d_.prefetch_stream, d_.prefetch_fork, 0));
  FLOTILLA_CUDA_RETURN(kc::LaunchL2Prefetch(p, bytes, d_.prefetch_stream));
  prefetch_forked_ = true;
  return absl::OkStatus();
}

absl::Status LayerStages::JoinPrefetches() {
  if (!prefetch_forked_) return absl::OkStatus();
  prefetch_forked_ = false;
  FLOTILLA_CUDA_RETURN(cudaEventRecord(d_.prefetch_join, d_.prefetch_stream));
  return CudaStatus(cudaStreamWaitEvent(d_.stream, d_.prefetch_join, 0), "join prefetches");
}

absl::Status LayerStages::AttentionBlock(int layer) {
  const CudaDeviceState::Layer& L = d_.layers[layer];
  batch_.block_tables = d_.meta + d_.meta_at.tables + L.kv_group * d_.meta_at.tables_stride;
  FLOTILLA_RETURN_IF_ERROR(NormQkvRope(L));
  // The O projection's weights stream into L2 while attention runs.
  FLOTILLA_RETURN_IF_ERROR(Prefetch(L.wo, static_cast<size_t>(H_) * NH_ * D_ * sizeof(uint16_t)));
  FLOTILLA_RETURN_IF_ERROR(Attention(L));
  return OProjection(L);
}

absl::Status LayerStages::NormQkvRope(const CudaDeviceState::Layer& L) {
  const int32_t* slots = d_.meta + d_.meta_at.slots + L.kv_group * d_.meta_at.slots_stride;
  if (!L.kv.fp8()) return WriteQkv(L, L.kv, slots);
  // An FP8 layer: the new K and V go to bf16 staging (token t at slot t),
  // then into the cache as codes and scales.
  kc::PagedKvLayer staging;
  staging.k = d_.kv_stage_k;
  staging.v = d_.kv_stage_v;
  staging.num_blocks = d_.max_tokens;
  staging.block_size = 1;
  staging.kv_heads = L.kv.kv_heads;
  staging.head_dim = L.kv.head_dim;
  FLOTILLA_RETURN_IF_ERROR(WriteQkv(L, staging, d_.kv_stage_slots));
  FLOTILLA_RETURN_IF_ERROR(Mark("kv_quantize"));
  if (!On("kv_quantize")) return absl::OkStatus();
  FLOTILLA_CUDA_RETURN(
      kc::LaunchKvQuantize(d_.kv_stage_k, d_.kv_stage_v, slots, T_, L.kv, d_.stream));
  return absl::OkStatus();
}

absl::Status LayerStages::WriteQkv(const CudaDeviceState::Layer& L, const kc::PagedKvLayer& kv,
                                   const int32_t* slots) {
  cudaStream_t s = d_.stream;
  const int32_t* pos = d_.meta + d_.meta_at.pos;
  const bool fused = T_ <= options_.fused_qkv_max_tokens && T_ <= kc::kNormQkvRopeMaxTokens &&
                     kc::NormQkvRopeSupported(T_, H_, D_);
  if (fused) {
    // Few tokens: the input norm, the QKV projection, RoPE and the KV write
    // in one launch (labelled as the projection it mostly is).
    FLOTILLA_RETURN_IF_ERROR(Mark("qkv_linear"));
    if (!On("qkv_linear")) return absl::OkStatus();
    kc::NormQkvRopeTuning tuning = options_.qkv_tuning;
    // Past the first layer the prefetch stream asked for these weights.
    if (prefetch_next_qkv_ && &L != &d_.layers.front()) tuning.l2_prefetch = false;
    return CudaStatus(
        kc::LaunchNormQkvRope(d_.x, L.input_norm, eps_, L.wqkv, L.bqkv, T_, H_, NH_, pos, slots,
                              d_.inv_freq, d_.rope_scaling, kv, d_.q, s, tuning),
        "LaunchNormQkvRope");
  }
  FLOTILLA_RETURN_IF_ERROR(Mark("rmsnorm"));
  if (On("rmsnorm")) {
    FLOTILLA_CUDA_RETURN(kc::LaunchAddRmsNorm(d_.x, nullptr, L.input_norm, T_, H_, eps_, d_.t, s));
  }
  FLOTILLA_RETURN_IF_ERROR(Mark("qkv_linear"));
  if (On("qkv_linear")) {
    FLOTILLA_CUDA_RETURN(
        kc::LaunchLinear(d_.linear, d_.t, L.wqkv, L.bqkv, T_, H_, QKV_, false, d_.qkv, s));
  }
  FLOTILLA_RETURN_IF_ERROR(Mark("rope_kv_write"));
  if (On("rope_kv_write")) {
    FLOTILLA_CUDA_RETURN(kc::LaunchRopeKvWrite(d_.qkv, pos, slots, T_, NH_, d_.inv_freq,
                                               d_.rope_scaling, kv, d_.q, s,
                                               kc::QkvRowOrder::kRopePairs));
  }
  return absl::OkStatus();
}

absl::Status LayerStages::Attention(const CudaDeviceState::Layer& L) {
  FLOTILLA_RETURN_IF_ERROR(Mark("attention"));
  if (!On("attention")) return absl::OkStatus();
  const float scale = 1.0f / std::sqrt(static_cast<float>(D_));
  if (D_ == 64) {
    FLOTILLA_CUDA_RETURN(kc::LaunchAttention(d_.q, L.kv, batch_, NH_, L.sinks, L.window, scale,
                                             d_.attn, d_.attn_ws, d_.attn_ws_bytes, d_.stream,
                                             options_.attention_prefill_wgmma));
  } else {
    FLOTILLA_CUDA_RETURN(kc::LaunchAttentionGeneric(d_.q, L.kv, batch_, NH_, L.sinks, L.window,
                                                    scale, d_.attn, d_.stream));
  }
  return absl::OkStatus();
}

absl::Status LayerStages::OProjection(const CudaDeviceState::Layer& L) {
  FLOTILLA_RETURN_IF_ERROR(Mark("o_linear"));
  // Tensor parallel: this rank's heads give a partial O projection; the
  // all-reduce sums it over the TP group and adds it to the residual.
  const bool tp_sum = tp_ > 1;
  if (tp_sum && T_ <= options_.tp_sum_in_projection_max_tokens) {
    kc::EpLaunch lines;
    if (par_->tp().DeviceLines(&lines) && kc::LinearTpSumFits(lines, T_, NH_ * D_, H_)) {
      if (!On("o_linear")) return absl::OkStatus();
      return CudaStatus(
          kc::LaunchLinearTpSum(d_.attn, L.wo, L.bo, T_, NH_ * D_, H_, d_.x, lines, d_.stream),
          "LaunchLinearTpSum");
    }
  }
  if (On("o_linear")) {
    FLOTILLA_CUDA_RETURN(kc::LaunchLinear(d_.linear, d_.attn, L.wo, L.bo, T_, NH_ * D_, H_, !tp_sum,
                                          tp_sum ? d_.o_part : d_.x, d_.stream));
  }
  if (!tp_sum) return absl::OkStatus();
  FLOTILLA_RETURN_IF_ERROR(Mark("tp_all_reduce"));
  return par_->tp().AllReduceAdd(d_.o_part, d_.x, static_cast<int64_t>(T_) * H_, d_.stream);
}

absl::Status LayerStages::Router(int layer) {
  const CudaDeviceState::Layer& L = d_.layers[layer];
  cudaStream_t s = d_.stream;
  // The router projection adds into zeroed logits (so a few tokens can
  // split its input over many blocks) and the ranking zeroes them again.
  // Few tokens: the norm runs inside the projection, which also writes the
  // normalised rows (the experts' input), and the ranking after it in the
  // same launch.
  const bool fused =
      T_ <= std::min(options_.fused_router_norm_max_tokens, kc::kNormLinearMaxTokens);
  routed_ = false;
  if (fused && On("router_linear") && On("router_topk")) {
    FLOTILLA_RETURN_IF_ERROR(Mark("router_linear"));
    // One GPU: the router's kernel also leaves the MoE's routing in its
    // workspace, and the MoE launch skips its own routing pass.
    const bool route = options_.route_in_router && par_ == nullptr && On("moe") &&
                       E_ <= kc::kNormLinearTopKRouteMaxExperts;
    const kc::MoeRouteTargets targets =
        route ? kc::MoeRouteTargetsIn(L.moe, T_, K_, deterministic_, d_.moe_ws, d_.invalid)
              : kc::MoeRouteTargets{};
    FLOTILLA_CUDA_RETURN(kc::LaunchNormLinearTopK(
        d_.x, L.post_norm, eps_, L.router, L.router_bias, T_, H_, E_, d_.router_logits, d_.t, K_,
        d_.topk_ids, d_.topk_w, d_.router_done, s, deterministic_, route ? &targets : nullptr,
        T_ <= options_.router_cluster_max_tokens));
    routed_ = route;
    return RecordRouting(layer);
  }
  if (fused) {
    FLOTILLA_RETURN_IF_ERROR(Mark("router_linear"));
    if (On("router_linear")) {
      FLOTILLA_CUDA_RETURN(kc::LaunchNormLinear(d_.x, L.post_norm, eps_, L.router, L.router_bias,
                                                T_, H_, E_, true, d_.router_logits, d_.t, s,
                                                deterministic_));
    }
  } else {
    FLOTILLA_RETURN_IF_ERROR(Mark("rmsnorm"));
    if (On("rmsnorm")) {
      FLOTILLA_CUDA_RETURN(kc::LaunchAddRmsNorm(d_.x, nullptr, L.post_norm, T_, H_, eps_, d_.t, s));
    }
    FLOTILLA_RETURN_IF_ERROR(Mark("router_linear"));
    if (On("router_linear")) {
      FLOTILLA_CUDA_RETURN(kc::LaunchLinear(d_.linear, d_.t, L.router, L.router_bias, T_, H_, E_,
                                            true, d_.router_logits, s));
    }
  }
  FLOTILLA_RETURN_IF_ERROR(Mark("router_topk"));
  if (On("router_topk")) {
    FLOTILLA_CUDA_RETURN(kc::LaunchRouterTopK(d_.router_logits, T_, E_, K_, d_.topk_ids, d_.topk_w,
                                              s, /*clear_logits=*/true));
  }
  return RecordRouting(layer);
}

absl::Status LayerStages::RecordRouting(int layer) {
  if (d_.routing_record == nullptr) return absl::OkStatus();
  cudaStream_t s = d_.stream;
  return CudaStatus(
      cudaMemcpyAsync(d_.routing_record + static_cast<size_t>(layer) * d_.max_tokens * K_,
                      d_.topk_ids, static_cast<size_t>(T_) * K_ * sizeof(int32_t),
                      cudaMemcpyDeviceToDevice, s),
      "record routing");
}

absl::Status LayerStages::Moe(int layer) {
  FLOTILLA_RETURN_IF_ERROR(Mark("moe"));
  if (moe_tp_) return TensorParallelMoe(layer, T_);
  if (par_ != nullptr) return ExpertParallelMoe(layer, T_);
  if (!On("moe")) return absl::OkStatus();
  return CudaStatus(kc::LaunchMoeLayer(d_.layers[layer].moe, d_.t, d_.topk_ids, d_.topk_w, T_, K_,
                                       static_cast<float>(c_.swiglu_limit), 1.702f, d_.x, d_.moe_ws,
                                       d_.moe_ws_bytes, d_.invalid, d_.stream, deterministic_,
                                       options_.moe_tuning, routed_),
                    "LaunchMoeLayer");
}

absl::Status LayerStages::ExpertParallelMoe(int layer, int tokens) {
  cudaStream_t stream = d_.stream;
  parallel::ExpertParallel& ep = par_->ep();
  FLOTILLA_ASSIGN_OR_RETURN(const parallel::ExpertRows rows,
                            ep.Dispatch(layer, d_.t, d_.topk_ids, d_.topk_w, tokens, stream));
  if (rows.rows < 0 || static_cast<size_t>(rows.rows) > d_.moe_rows) {
    return absl::InternalError(absl::StrCat("layer ", layer, ": dispatch gave ", rows.rows,
                                            " rows; the MoE workspace holds ", d_.moe_rows));
  }
  if (d_.expert_counts != nullptr && rows.rows > 0) {
    FLOTILLA_CUDA_RETURN(kc::LaunchCountExpertRows(
        rows.slot, rows.rows, d_.max_slots,
        d_.expert_counts + static_cast<size_t>(layer) * d_.max_slots, stream));
  }
  // The rows' weights are 1 (0 for padding): the outputs stay unweighted and
  // Combine applies the router weights.
  if (rows.rows > 0) {
    FLOTILLA_CUDA_RETURN(kc::LaunchMoeLayer(
        d_.layers[layer].moe, static_cast<const uint16_t*>(rows.x), rows.slot, rows.ones,
        static_cast<int>(rows.rows), 1, static_cast<float>(c_.swiglu_limit), 1.702f, rows.out,
        d_.moe_ws, d_.moe_ws_bytes, nullptr, stream, deterministic_, options_.moe_tuning));
  }
  FLOTILLA_RETURN_IF_ERROR(ep.Combine(layer, d_.moe_y, stream));
  FLOTILLA_CUDA_RETURN(
      kc::LaunchAddInPlace(d_.x, d_.moe_y, static_cast<size_t>(tokens) * c_.hidden_size, stream));
  return absl::OkStatus();
}

absl::Status LayerStages::TensorParallelMoe(int layer, int tokens) {
  cudaStream_t stream = d_.stream;
  const kc::MoeDeviceWeights& moe = d_.layers[layer].moe;
  const size_t n = static_cast<size_t>(tokens) * c_.hidden_size;
  // The experts add into moe_y, which each all-reduce leaves zero; the
  // step's first layer zeroes it in case an earlier step stopped midway.
  if (layer == 0) FLOTILLA_CUDA_RETURN(cudaMemsetAsync(d_.moe_y, 0, n * sizeof(float), stream));
  FLOTILLA_CUDA_RETURN(
      kc::LaunchMoeLayer(moe, d_.t, d_.topk_ids, d_.topk_w, tokens, c_.num_experts_per_tok,
                         static_cast<float>(c_.swiglu_limit), 1.702f, d_.moe_y, d_.moe_ws,
                         d_.moe_ws_bytes, d_.invalid, stream, deterministic_, options_.moe_tuning));
  return par_->tp().AllReduceAdd(d_.moe_y, d_.x, static_cast<int64_t>(n), stream);
}

absl::Status LayerStages::Logits(int logit_rows, int row_offset) {
  cudaStream_t s = d_.stream;
  FLOTILLA_RETURN_IF_ERROR(Mark("rmsnorm"));
  if (On("rmsnorm")) {
    FLOTILLA_CUDA_RETURN(kc::LaunchRmsNormRows(d_.x, d_.meta + d_.meta_at.rows + row_offset,
                                               logit_rows, d_.final_norm, H_, eps_, d_.final_t, s));
  }
  FLOTILLA_RETURN_IF_ERROR(Mark("lm_head"));
  if (On("lm_head")) {
    if (plan_.group_logits) {
      FLOTILLA_RETURN_IF_ERROR(GroupLmHead(logit_rows));
    } else {
      FLOTILLA_CUDA_RETURN(kc::LaunchLinear(d_.linear, d_.final_t, d_.lm_head, nullptr, logit_rows,
                                            H_, V_, false, d_.logits, s));
    }
  }
  if (!sample_) return absl::OkStatus();
  FLOTILLA_RETURN_IF_ERROR(Mark("sample"));
  return sample_(logit_rows, s);
}

absl::Status LayerStages::GroupLmHead(int logit_rows) {
  if (par_ == nullptr || d_.group_logits == nullptr || logit_rows > kMaxGroupLogitRows) {
    return absl::InternalError(
        absl::StrCat("group logits over ", logit_rows, " rows without a TP group's buffers"));
  }
  cudaStream_t s = d_.stream;
  // Rank r's columns [v0, v1): whole 16-column units (the last rank takes
  // the remainder), so the weight rows start 16-byte aligned.
  const int W = par_->tp().size(), r = par_->tp().rank();
  const int64_t units = V_ / 16;
  const int64_t v0 = units * r / W * 16, v1 = r + 1 == W ? V_ : units * (r + 1) / W * 16;
  const int n = static_cast<int>(v1 - v0);
  const size_t row_bytes = static_cast<size_t>(V_) * sizeof(float);
  FLOTILLA_CUDA_RETURN(kc::LaunchLinear(d_.linear, d_.final_t, d_.lm_head + v0 * H_, nullptr,
                                        logit_rows, H_, n, false, d_.group_logits, s));
  FLOTILLA_CUDA_RETURN(cudaMemsetAsync(d_.logits, 0, logit_rows * row_bytes, s));
  FLOTILLA_CUDA_RETURN(cudaMemcpy2DAsync(d_.logits + v0, row_bytes, d_.group_logits,
                                         n * sizeof(float), n * sizeof(float), logit_rows,
                                         cudaMemcpyDeviceToDevice, s));
  return par_->tp().AllReduce(d_.logits, static_cast<int64_t>(logit_rows) * V_, s);
}

absl::Status LayerStages::LogitRows(int rows, int row_offset) {
  FLOTILLA_CUDA_RETURN(kc::LaunchRmsNormRows(d_.x, d_.meta + d_.meta_at.rows + row_offset, rows,
                                             d_.final_norm, H_, eps_, d_.final_t, d_.stream));
  FLOTILLA_CUDA_RETURN(kc::LaunchLinear(d_.linear, d_.final_t, d_.lm_head, nullptr, rows, H_, V_,
                                        false, d_.logits, d_.stream));
  return absl::OkStatus();
}

}  // namespace flotilla
