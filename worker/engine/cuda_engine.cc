#include "worker/engine/cuda_engine.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <thread>
#include <tuple>
#include <unordered_set>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/attention_generic.h"
#include "kernels/cuda/expert_count.h"
#include "kernels/cuda/fill.h"
#include "kernels/cuda/moe.h"
#include "kernels/cuda/ops.h"
#include "worker/engine/cuda_weight_feed.h"
#include "worker/engine/step_layout.h"
#include "worker/model/expert_slice.h"
#include "worker/parallel/parallel_context.h"

namespace flotilla {
namespace {

namespace kc = kernels::cuda;

absl::Status CudaStatus(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("cuda: ", what, ": ", cudaGetErrorString(err)));
}

#define FLOTILLA_CUDA_RETURN(expr) FLOTILLA_RETURN_IF_ERROR(CudaStatus((expr), #expr))

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// What one rank holds: its TP rank's heads and, per layer, the expert in
// each MoE slot (the slot ids ExpertMap gives this rank; -1: slot unused).
// Without a ParallelContext: every head, and expert e in slot e. The
// tensor-parallel MoE layout: expert e in slot e, each this TP rank's slice.
struct RankShard {
  int tp_rank = 0;
  int tp_size = 1;
  bool moe_tp = false;
  std::vector<std::vector<int>> slot_expert;  // [layer][slot]
  int max_slots = 0;
};

absl::StatusOr<RankShard> ShardOfRank(const ModelConfig& c, const parallel::ParallelContext* p) {
  RankShard shard;
  const int L = c.num_hidden_layers, E = c.num_local_experts;
  if (p == nullptr || p->config().moe_tp()) {
    std::vector<int> all(E);
    for (int e = 0; e < E; ++e) all[e] = e;
    shard.slot_expert.assign(L, all);
    shard.max_slots = E;
    if (p != nullptr) {
      shard.tp_rank = p->config().tp_rank_of(p->rank());
      shard.tp_size = p->config().tp_size();
      shard.moe_tp = true;
    }
    return shard;
  }
  const ParallelConfig& pc = p->config();
  const ExpertMap& map = p->expert_map();
  if (map.num_layers() != L || map.num_experts() != E || map.world_size() != pc.world_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda engine: the expert map covers ", map.num_layers(), " layers x ", map.num_experts(),
        " experts over ", map.world_size(), " ranks; the model has ", L, " x ", E,
        " and the instance ", pc.world_size(), " ranks"));
  }
  shard.tp_rank = pc.tp_rank_of(p->rank());
  shard.tp_size = pc.tp_size();
  shard.slot_expert.resize(L);
  for (int l = 0; l < L; ++l) {
    std::vector<int>& slots = shard.slot_expert[l];
    slots.assign(map.SlotsOnRank(l, p->rank()), -1);
    for (int e = 0; e < E; ++e) {
      for (const ExpertLocation& loc : map.replicas(l, e)) {
        if (loc.rank == p->rank()) slots[loc.slot] = e;
      }
    }
    shard.max_slots = std::max(shard.max_slots, static_cast<int>(slots.size()));
  }
  if (shard.max_slots == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda engine: rank ", p->rank(), " holds no expert"));
  }
  return shard;
}

}  // namespace

// Device state: weights, KV arena, step buffers, graphs.
struct CudaEngine::Impl {
  struct Layer {
    uint16_t* input_norm = nullptr;
    uint16_t* post_norm = nullptr;
    // [(NH + 2 NKV) D, H], q and k rows in kc::QkvRowOrder::kRopePairs
    uint16_t* wqkv = nullptr;
    uint16_t* bqkv = nullptr;  // same order
    uint16_t* wo = nullptr;  // [H, NH D]
    uint16_t* bo = nullptr;
    uint16_t* router = nullptr;  // [E, H]
    uint16_t* router_bias = nullptr;
    float* sinks = nullptr;
    kc::MoeDeviceWeights moe;
    kc::PagedKvLayer kv;
    int window = 0;
    int kv_group = 0;  // the KvBlockAllocator group whose block table it reads
  };

  int device = 0;
  cudaStream_t stream = nullptr;
  kc::LinearContext* linear = nullptr;
  std::vector<void*> allocations;
  size_t allocated_bytes = 0;  // through Alloc and the MoE weights

  uint16_t* embed = nullptr;
  uint16_t* final_norm = nullptr;
  uint16_t* lm_head = nullptr;
  std::vector<Layer> layers;
  float* inv_freq = nullptr;
  float rope_scaling = 1.0f;
  uint16_t* kv_arena = nullptr;

  // Step buffers, sized for the largest step.
  int max_tokens = 0, max_seqs = 0, logit_rows = 0;
  float* x = nullptr;          // [T, H] residual stream
  uint16_t* t = nullptr;       // [T, H] normed activations
  float* qkv = nullptr;        // [T, (NH + 2 NKV) D], rows as wqkv
  uint16_t* q = nullptr;       // [T, NH D]
  uint16_t* attn = nullptr;    // [T, NH D]
  float* router_logits = nullptr;  // [T, E], zero between steps' uses (see the router)
  // Sharded ranks: this rank's O-projection partial before the TP sum, and
  // the joined MoE output, both f32 [T, H].
  float* o_part = nullptr;
  float* moe_y = nullptr;
  size_t moe_rows = 0;  // rows the MoE workspace holds (received rows when sharded)
  int32_t* topk_ids = nullptr;
  int32_t* routing_record = nullptr;  // [layers][max_tokens * K] when recording
  float* topk_w = nullptr;
  uint16_t* final_t = nullptr;  // [rows, H]
  float* logits = nullptr;      // [logit_rows, V]
  int32_t* invalid = nullptr;
  void* moe_ws = nullptr;
  size_t moe_ws_bytes = 0;
  void* attn_ws = nullptr;
  size_t attn_ws_bytes = 0;
  void* sample_ws = nullptr;
  size_t sample_ws_bytes = 0;
  int32_t* sampled_tokens = nullptr;
  float* sampled_logprobs = nullptr;
  kc::SamplingRow* sample_params = nullptr;
  // Penalties and logit bias (LaunchAdjustLogits), raw logprobs of tokens
  // drawn from adjusted logits (a greedy reference draw), top logprobs.
  static constexpr int kAdjustCapacity = 1 << 18;
  static constexpr int kMaxTopLogprobs = 20;
  kc::LogitAdjustmentEntry* adjust = nullptr;
  float* adjust_saved = nullptr;
  int32_t* adjust_count = nullptr;
  kc::SamplingRow* greedy_params = nullptr;
  int32_t* ref_tokens = nullptr;
  float* ref_logprobs = nullptr;
  int32_t* top_ids = nullptr;      // [max_seqs, kMaxTopLogprobs]
  float* top_logprobs = nullptr;   // [max_seqs, kMaxTopLogprobs]
  // Token masks of structured-output rows (LaunchMaskLogits): every row of
  // a step (mask_capacity = its sequences) keeps the device sampler under its mask.
  int mask_capacity = 0;
  int mask_words = 0;
  uint32_t* masks = nullptr;      // [mask_capacity, mask_words]
  int32_t* mask_rows = nullptr;   // [mask_capacity + 1]: the logit rows, then the count

  // Step metadata: one int32 region on the device at fixed offsets (graphs
  // keep the addresses), filled from a pinned host mirror.
  int32_t* meta = nullptr;
  int32_t* meta_host = nullptr;
  // Sharded ranks: rows run per (layer, slot) [layers * max_slots] on the
  // device, read back into the pinned mirror after a step (counts_event).
  int max_slots = 0;
  uint32_t* expert_counts = nullptr;
  uint32_t* expert_counts_host = nullptr;
  cudaEvent_t counts_event = nullptr;
  bool counts_pending = false;
  // Hot swap: the stream StageExperts copies on (its own thread) and the map
  // version it last staged.
  cudaStream_t copy_stream = nullptr;
  std::atomic<uint64_t> staged_version{0};
  std::vector<std::vector<int>> counts_slot_expert;  // the map the read-back counted under
  StepMetaOffsets meta_at;                           // the regions of `meta`
  int kv_groups = 1;
  kc::SamplingRow* params_host = nullptr;
  int32_t* tokens_host = nullptr;
  float* logprobs_host = nullptr;
  kc::LogitAdjustmentEntry* adjust_host = nullptr;  // [kAdjustCapacity + 1]; the count after
  uint32_t* masks_host = nullptr;     // mirrors of masks and mask_rows
  int32_t* mask_rows_host = nullptr;
  int32_t* top_ids_host = nullptr;
  float* top_logprobs_host = nullptr;

  // Decode graphs by (padded batch, context bucket, sampling variant, the
  // instance's step-token bound when sharded).
  std::map<std::tuple<int, int64_t, int, int64_t>, cudaGraphExec_t> graphs;

  ~Impl() {
    if (device >= 0) cudaSetDevice(device);
    for (auto& [key, exec] : graphs) cudaGraphExecDestroy(exec);
    for (Layer& l : layers) kc::FreeMoeWeights(&l.moe);
    for (void* p : allocations) cudaFree(p);
    if (meta_host != nullptr) cudaFreeHost(meta_host);
    if (expert_counts_host != nullptr) cudaFreeHost(expert_counts_host);
    if (counts_event != nullptr) cudaEventDestroy(counts_event);
    if (copy_stream != nullptr) cudaStreamDestroy(copy_stream);
    if (params_host != nullptr) cudaFreeHost(params_host);
    if (tokens_host != nullptr) cudaFreeHost(tokens_host);
    if (logprobs_host != nullptr) cudaFreeHost(logprobs_host);
    if (adjust_host != nullptr) cudaFreeHost(adjust_host);
    if (masks_host != nullptr) cudaFreeHost(masks_host);
    if (mask_rows_host != nullptr) cudaFreeHost(mask_rows_host);
    if (top_ids_host != nullptr) cudaFreeHost(top_ids_host);
    if (top_logprobs_host != nullptr) cudaFreeHost(top_logprobs_host);
    if (linear != nullptr) kc::DestroyLinearContext(linear);
    if (stream != nullptr) cudaStreamDestroy(stream);
  }

  template <typename T>
  absl::Status Alloc(T** p, size_t count) {
    void* raw = nullptr;
    const size_t bytes = std::max<size_t>(count * sizeof(T), 16);
    cudaError_t err = cudaMalloc(&raw, bytes);
    if (err != cudaSuccess) {
      return absl::ResourceExhaustedError(absl::StrCat("cuda: cannot allocate ", bytes,
                                                       " bytes on device ", device, ": ",
                                                       cudaGetErrorString(err)));
    }
    allocations.push_back(raw);
    allocated_bytes += bytes;
    *p = static_cast<T*>(raw);
    return absl::OkStatus();
  }

  // Buffers for penalties, logit bias and logprobs (see above).
  absl::Status AllocSamplingExtras(int rows, int vocab) {
    const int cap = kAdjustCapacity, top = kMaxTopLogprobs;
    mask_capacity = rows;
    mask_words = (vocab + 31) / 32;
    const size_t mask_bytes = static_cast<size_t>(mask_capacity) * mask_words * sizeof(uint32_t);
    FLOTILLA_RETURN_IF_ERROR(Alloc(&masks, static_cast<size_t>(mask_capacity) * mask_words));
    FLOTILLA_RETURN_IF_ERROR(Alloc(&mask_rows, mask_capacity + 1));
    FLOTILLA_CUDA_RETURN(cudaMallocHost(reinterpret_cast<void**>(&masks_host), mask_bytes));
    FLOTILLA_CUDA_RETURN(cudaMallocHost(reinterpret_cast<void**>(&mask_rows_host),
                                        (mask_capacity + 1) * sizeof(int32_t)));
    FLOTILLA_RETURN_IF_ERROR(Alloc(&adjust, cap));
    FLOTILLA_RETURN_IF_ERROR(Alloc(&adjust_saved, cap));
    FLOTILLA_RETURN_IF_ERROR(Alloc(&adjust_count, 1));
    FLOTILLA_RETURN_IF_ERROR(Alloc(&greedy_params, rows));
    FLOTILLA_RETURN_IF_ERROR(Alloc(&ref_tokens, rows));
    FLOTILLA_RETURN_IF_ERROR(Alloc(&ref_logprobs, rows));
    FLOTILLA_RETURN_IF_ERROR(Alloc(&top_ids, static_cast<size_t>(rows) * top));
    FLOTILLA_RETURN_IF_ERROR(Alloc(&top_logprobs, static_cast<size_t>(rows) * top));
    const std::vector<kc::SamplingRow> greedy(rows);  // temperature 0
    FLOTILLA_CUDA_RETURN(cudaMemcpy(greedy_params, greedy.data(), rows * sizeof(kc::SamplingRow),
                                    cudaMemcpyHostToDevice));
    FLOTILLA_CUDA_RETURN(cudaMallocHost(reinterpret_cast<void**>(&adjust_host),
                                        (cap + 1) * sizeof(kc::LogitAdjustmentEntry)));
    FLOTILLA_CUDA_RETURN(cudaMallocHost(reinterpret_cast<void**>(&top_ids_host),
                                        static_cast<size_t>(rows) * top * sizeof(int32_t)));
    FLOTILLA_CUDA_RETURN(cudaMallocHost(reinterpret_cast<void**>(&top_logprobs_host),
                                        static_cast<size_t>(rows) * top * sizeof(float)));
    return absl::OkStatus();
  }
};


CudaEngine::CudaEngine(std::unique_ptr<Impl> impl, const ModelConfig& config)
    : impl_(std::move(impl)), config_(config) {}

CudaEngine::~CudaEngine() {
  // The generation is over and its peers may be gone: exchanges still in
  // flight (a step that failed half-way) end now instead of holding the
  // teardown, which waits for the device.
  if (impl_ != nullptr && options_.parallel != nullptr) AbortExchanges();
}

absl::StatusOr<std::unique_ptr<CudaEngine>> CudaEngine::Create(const ModelWeights& weights,
                                                               const CudaEngineOptions& options) {
  const ModelConfig& c = weights.config;
  if (static_cast<int>(weights.layers.size()) != c.num_hidden_layers ||
      weights.embed.data == nullptr || weights.lm_head.data == nullptr ||
      weights.final_norm.data == nullptr) {
    return absl::InvalidArgumentError(
        "cuda engine: the weights must hold every layer, the embedding, model.norm and lm_head");
  }
  FLOTILLA_ASSIGN_OR_RETURN(const RankShard shard, ShardOfRank(c, options.parallel));
  const char* whose = options.parallel == nullptr ? "a single-GPU engine" : "this rank";
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const LayerWeights& L = weights.layers[l];
    if (L.attn.q_heads != c.num_attention_heads / shard.tp_size ||
        L.attn.kv_heads != c.num_key_value_heads / shard.tp_size ||
        L.attn.q_head_begin != shard.tp_rank * L.attn.q_heads) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cuda engine: layer ", l, " holds q heads [", L.attn.q_head_begin, ", +",
          L.attn.q_heads, "); ", whose, " needs the heads of TP rank ", shard.tp_rank, " of ",
          shard.tp_size));
    }
    for (int e : shard.slot_expert[l]) {
      if (e >= 0 && (static_cast<int>(L.slot_of_expert.size()) != c.num_local_experts ||
                     L.slot_of_expert[e] < 0)) {
        return absl::InvalidArgumentError(absl::StrCat("cuda engine: layer ", l,
                                                       " does not hold expert ", e, ", which ",
                                                       whose, " runs"));
      }
    }
  }
  return Build(c, std::make_unique<HostWeightsFeed>(weights), 0, options);
}

absl::StatusOr<std::unique_ptr<CudaEngine>> CudaEngine::CreateSynthetic(
    const ModelConfig& config, uint64_t seed, const CudaEngineOptions& options) {
  return Build(config, nullptr, seed, options);
}

namespace {

// The uploads read host or device memory alike (cudaMemcpyDefault): a weight
// feed may hand over pieces it generated on the device.

// Copies a possibly strided bf16 matrix into a dense [rows, cols] device block.
absl::Status UploadMatrix(const Bf16Matrix& m, uint16_t* dst, cudaStream_t stream) {
  return CudaStatus(cudaMemcpy2DAsync(dst, m.cols * sizeof(uint16_t), m.data,
                                      m.row_stride * sizeof(uint16_t), m.cols * sizeof(uint16_t),
                                      m.rows, cudaMemcpyDefault, stream),
                    "upload matrix");
}

absl::Status UploadVector(const Bf16Vector& v, uint16_t* dst, cudaStream_t stream) {
  return CudaStatus(cudaMemcpyAsync(dst, v.data, v.size * sizeof(uint16_t), cudaMemcpyDefault,
                                    stream),
                    "upload vector");
}

// The rows of a q or k projection [heads * head_dim, cols] (or its bias, cols
// = 1) in QkvRowOrder::kRopePairs: per head, dimensions 0..D/2-1 go to the
// even rows and D/2..D-1 to the odd ones, two strided copies per head.
absl::Status UploadRopePairs(const uint16_t* src, size_t src_stride, int64_t rows, int64_t cols,
                             int64_t head_dim, uint16_t* dst, cudaStream_t stream) {
  const int64_t half = head_dim / 2;
  for (int64_t h0 = 0; h0 < rows; h0 += head_dim) {
    for (int64_t part = 0; part < 2; ++part) {
      const cudaError_t err = cudaMemcpy2DAsync(
          dst + (h0 + part) * cols, 2 * cols * sizeof(uint16_t),
          src + (h0 + part * half) * src_stride, src_stride * sizeof(uint16_t),
          cols * sizeof(uint16_t), half, cudaMemcpyDefault, stream);
      if (err != cudaSuccess) return CudaStatus(err, "upload q/k rows in rope-pair order");
    }
  }
  return absl::OkStatus();
}

absl::Status UploadMatrixRopePairs(const Bf16Matrix& m, int64_t head_dim, uint16_t* dst,
                                   cudaStream_t stream) {
  if (m.rows % head_dim != 0) {
    return absl::InvalidArgumentError("cuda engine: a q/k projection of partial heads");
  }
  return UploadRopePairs(m.data, m.row_stride, m.rows, m.cols, head_dim, dst, stream);
}

absl::Status UploadVectorRopePairs(const Bf16Vector& v, int64_t head_dim, uint16_t* dst,
                                   cudaStream_t stream) {
  if (v.size % head_dim != 0) {
    return absl::InvalidArgumentError("cuda engine: a q/k bias of partial heads");
  }
  return UploadRopePairs(v.data, 1, v.size, 1, head_dim, dst, stream);
}

// The KV block groups of `c`: the full-attention layers (group 0) and, when
// the model has both kinds, the sliding-window layers (group 1). The kernels
// write every new position of a step into the cache.
KvBlockAllocatorOptions KvGroups(const ModelConfig& c, const CudaEngineOptions& o) {
  bool any_full = false, any_sliding = false;
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    (c.is_sliding(l) && c.sliding_window > 0 ? any_sliding : any_full) = true;
  }
  KvBlockAllocatorOptions k;
  k.sliding = any_full && any_sliding ? std::vector<bool>{false, true}
                                      : std::vector<bool>{any_sliding};
  k.window = c.sliding_window;
  k.block_size = o.kv_block_size;
  k.prefix_cache = o.prefix_cache;
  k.write_whole_chunk = true;
  k.max_chunk_tokens = o.max_batch_tokens;
  return k;
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaEngine>> CudaEngine::Build(const ModelConfig& c,
                                                              std::unique_ptr<CudaWeightFeed> feed,
                                                              uint64_t seed,
                                                              const CudaEngineOptions& options) {
  FLOTILLA_ASSIGN_OR_RETURN(RankShard shard, ShardOfRank(c, options.parallel));
  if (options.parallel != nullptr && !shard.moe_tp) {
    shard.max_slots += std::max(0, options.spare_expert_slots);
  }
  const int64_t H = c.hidden_size, D = c.head_dim, I = c.intermediate_size;
  // The experts' intermediate size on this rank: a slice with the
  // tensor-parallel MoE layout.
  const ExpertSliceLayout slice = ExpertSliceOf(H, I, shard.tp_rank, shard.tp_size);
  const int64_t I_rank = shard.moe_tp ? slice.slice.size : I;
  // This rank's heads (all of them without tensor parallelism).
  const int64_t NH = c.num_attention_heads / shard.tp_size;
  const int64_t NKV = c.num_key_value_heads / shard.tp_size;
  const int64_t E = c.num_local_experts, K = c.num_experts_per_tok, V = c.vocab_size;
  const int64_t QKV = (NH + 2 * NKV) * D;
  if (H <= 0 || H % 32 != 0 || I <= 0 || I % 32 != 0 || NH <= 0 || NKV <= 0 || NH % NKV != 0 ||
      E <= 0 || K <= 0 || K > E || V <= 0 || static_cast<int>(c.layer_types.size()) != c.num_hidden_layers ||
      (D != 16 && D != 32 && D != 64 && D != 128)) {
    return absl::InvalidArgumentError(
        "cuda engine: needs hidden and intermediate sizes that are multiples of 32, head_dim in "
        "{16, 32, 64, 128}, GQA heads, 0 < experts_per_tok <= experts and one layer type per layer");
  }
  if (options.kv_block_size < 16 || options.kv_block_size > 128 ||
      (options.kv_block_size & (options.kv_block_size - 1)) != 0) {
    return absl::InvalidArgumentError("cuda engine: kv_block_size must be a power of two in [16, 128]");
  }
  if (options.max_batch_tokens <= 0 || options.max_sequences <= 0 ||
      options.max_sequences > options.max_batch_tokens) {
    return absl::InvalidArgumentError(
        "cuda engine: need 0 < max_sequences <= max_batch_tokens");
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || options.device < 0 ||
      options.device >= devices) {
    return absl::FailedPreconditionError(absl::StrCat("cuda engine: no CUDA device ", options.device,
                                                      " (", devices, " present)"));
  }
  auto impl = std::make_unique<Impl>();
  Impl& d = *impl;
  d.device = options.device;
  FLOTILLA_CUDA_RETURN(cudaSetDevice(d.device));
  FLOTILLA_CUDA_RETURN(cudaStreamCreateWithFlags(&d.stream, cudaStreamNonBlocking));
  FLOTILLA_CUDA_RETURN(kc::CreateLinearContext(&d.linear));
  cudaStream_t s = d.stream;

  // Weights.
  size_t weight_bytes = 0;
  auto count = [&](size_t elems, size_t size) { weight_bytes += elems * size; };
  FLOTILLA_RETURN_IF_ERROR(d.Alloc(&d.embed, V * H));
  FLOTILLA_RETURN_IF_ERROR(d.Alloc(&d.lm_head, V * H));
  FLOTILLA_RETURN_IF_ERROR(d.Alloc(&d.final_norm, H));
  count(2 * V * H + H, 2);
  const float in_scale_h = std::sqrt(3.0f / static_cast<float>(H));
  const float in_scale_o = std::sqrt(3.0f / static_cast<float>(NH * D));
  if (feed != nullptr) {
    FLOTILLA_ASSIGN_OR_RETURN(const Bf16Matrix embed, feed->Embedding(s));
    FLOTILLA_RETURN_IF_ERROR(UploadMatrix(embed, d.embed, s));
    FLOTILLA_ASSIGN_OR_RETURN(const Bf16Matrix lm_head, feed->LmHead(s));
    FLOTILLA_RETURN_IF_ERROR(UploadMatrix(lm_head, d.lm_head, s));
    FLOTILLA_ASSIGN_OR_RETURN(const Bf16Vector final_norm, feed->FinalNorm(s));
    FLOTILLA_RETURN_IF_ERROR(UploadVector(final_norm, d.final_norm, s));
  } else {
    FLOTILLA_CUDA_RETURN(kc::LaunchFillBf16(d.embed, V * H, seed + 1, 1.0f, 0.0f, s));
    FLOTILLA_CUDA_RETURN(kc::LaunchFillBf16(d.lm_head, V * H, seed + 2, in_scale_h, 0.0f, s));
    FLOTILLA_CUDA_RETURN(kc::LaunchFillBf16(d.final_norm, H, seed + 3, 0.1f, 1.0f, s));
  }
  d.layers.resize(c.num_hidden_layers);
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    Impl::Layer& L = d.layers[l];
    L.window = c.is_sliding(l) ? c.sliding_window : 0;
    FLOTILLA_RETURN_IF_ERROR(d.Alloc(&L.input_norm, H));
    FLOTILLA_RETURN_IF_ERROR(d.Alloc(&L.post_norm, H));
    FLOTILLA_RETURN_IF_ERROR(d.Alloc(&L.wqkv, QKV * H));
    FLOTILLA_RETURN_IF_ERROR(d.Alloc(&L.bqkv, QKV));
    FLOTILLA_RETURN_IF_ERROR(d.Alloc(&L.wo, H * NH * D));
    FLOTILLA_RETURN_IF_ERROR(d.Alloc(&L.bo, H));
    FLOTILLA_RETURN_IF_ERROR(d.Alloc(&L.router, E * H));
    FLOTILLA_RETURN_IF_ERROR(d.Alloc(&L.router_bias, E));
    FLOTILLA_RETURN_IF_ERROR(d.Alloc(&L.sinks, NH));
    count(2 * H + QKV * H + QKV + H * NH * D + H + E * H + E, 2);
    count(NH, 4);
    const std::vector<int>& slot_expert = shard.slot_expert[l];
    FLOTILLA_CUDA_RETURN(kc::AllocMoeWeights(shard.max_slots, static_cast<int>(H),
                                             static_cast<int>(I_rank), &L.moe));
    weight_bytes += L.moe.ExpertBytes() * slot_expert.size();
    d.allocated_bytes += L.moe.ExpertBytes() * shard.max_slots;
    const uint64_t ls = seed + 1000 * static_cast<uint64_t>(l + 1);
    if (feed != nullptr) {
      FLOTILLA_ASSIGN_OR_RETURN(const LayerWeights src, feed->Layer(l, s));
      const AttentionWeights& a = src.attn;
      FLOTILLA_RETURN_IF_ERROR(UploadVector(src.input_norm, L.input_norm, s));
      FLOTILLA_RETURN_IF_ERROR(UploadVector(src.post_attn_norm, L.post_norm, s));
      // q and k rows in QkvRowOrder::kRopePairs (the order both QKV paths of
      // the step read); v rows as in the checkpoint.
      FLOTILLA_RETURN_IF_ERROR(UploadMatrixRopePairs(a.wq, D, L.wqkv, s));
      FLOTILLA_RETURN_IF_ERROR(UploadMatrixRopePairs(a.wk, D, L.wqkv + NH * D * H, s));
      FLOTILLA_RETURN_IF_ERROR(UploadMatrix(a.wv, L.wqkv + (NH + NKV) * D * H, s));
      FLOTILLA_RETURN_IF_ERROR(UploadVectorRopePairs(a.bq, D, L.bqkv, s));
      FLOTILLA_RETURN_IF_ERROR(UploadVectorRopePairs(a.bk, D, L.bqkv + NH * D, s));
      FLOTILLA_RETURN_IF_ERROR(UploadVector(a.bv, L.bqkv + (NH + NKV) * D, s));
      FLOTILLA_RETURN_IF_ERROR(UploadMatrix(a.wo, L.wo, s));
      // o_proj's bias joins the TP sum on TP rank 0 only.
      if (shard.tp_rank == 0) {
        FLOTILLA_RETURN_IF_ERROR(UploadVector(a.bo, L.bo, s));
      } else {
        FLOTILLA_CUDA_RETURN(cudaMemsetAsync(L.bo, 0, H * sizeof(uint16_t), s));
      }
      FLOTILLA_RETURN_IF_ERROR(UploadMatrix(src.router, L.router, s));
      FLOTILLA_RETURN_IF_ERROR(UploadVector(src.router_bias, L.router_bias, s));
      FLOTILLA_CUDA_RETURN(cudaMemcpyAsync(L.sinks, a.sinks.data(), NH * sizeof(float),
                                           cudaMemcpyHostToDevice, s));
      for (size_t slot = 0; slot < slot_expert.size(); ++slot) {
        if (slot_expert[slot] < 0) continue;
        const ExpertWeights& x = src.experts[src.slot_of_expert[slot_expert[slot]]];
        if (shard.moe_tp) {
          FLOTILLA_CUDA_RETURN(kc::UploadMoeExpertSlice(
              L.moe, static_cast<int>(slot), static_cast<int>(I), slice.slice.begin,
              slice.down_bias, x.gate_up.blocks, x.gate_up.scales, x.gate_up_bias.data,
              x.down.blocks, x.down.scales, x.down_bias.data, s));
          continue;
        }
        FLOTILLA_CUDA_RETURN(kc::UploadMoeExpert(L.moe, static_cast<int>(slot), x.gate_up.blocks,
                                                 x.gate_up.scales, x.gate_up_bias.data,
                                                 x.down.blocks, x.down.scales, x.down_bias.data,
                                                 s));
      }
    } else {
      FLOTILLA_CUDA_RETURN(kc::LaunchFillBf16(L.input_norm, H, ls + 1, 0.1f, 1.0f, s));
      FLOTILLA_CUDA_RETURN(kc::LaunchFillBf16(L.post_norm, H, ls + 2, 0.1f, 1.0f, s));
      FLOTILLA_CUDA_RETURN(kc::LaunchFillBf16(L.wqkv, QKV * H, ls + 3, in_scale_h, 0.0f, s));
      FLOTILLA_CUDA_RETURN(kc::LaunchFillBf16(L.bqkv, QKV, ls + 4, 0.02f, 0.0f, s));
      FLOTILLA_CUDA_RETURN(kc::LaunchFillBf16(L.wo, H * NH * D, ls + 5, in_scale_o, 0.0f, s));
      FLOTILLA_CUDA_RETURN(kc::LaunchFillBf16(L.bo, H, ls + 6, 0.02f, 0.0f, s));
      FLOTILLA_CUDA_RETURN(kc::LaunchFillBf16(L.router, E * H, ls + 7, in_scale_h, 0.0f, s));
      FLOTILLA_CUDA_RETURN(kc::LaunchFillBf16(L.router_bias, E, ls + 8, 0.02f, 0.0f, s));
      FLOTILLA_CUDA_RETURN(kc::LaunchFillF32(L.sinks, NH, ls + 9, 0.5f, 0.0f, s));
      FLOTILLA_CUDA_RETURN(kc::LaunchFillMoeWeightsSynthetic(L.moe, ls + 10, s));
    }
  }
  FLOTILLA_CUDA_RETURN(cudaStreamSynchronize(s));
  feed.reset();  // a feed's staging memory goes back before the KV cache is sized
  {
    kernels::cpu::YarnParams p;
    p.theta = c.rope_theta;
    p.head_dim = D;
    p.factor = c.rope_scaling.factor;
    p.original_max_position_embeddings =
        static_cast<double>(c.rope_scaling.original_max_position_embeddings);
    p.beta_fast = c.rope_scaling.beta_fast;
    p.beta_slow = c.rope_scaling.beta_slow;
    p.truncate = c.rope_scaling.truncate;
    const std::vector<float> inv_freq = kernels::cpu::YarnInvFreq(p);
    d.rope_scaling = kernels::cpu::YarnAttentionScaling(c.rope_scaling.factor);
    FLOTILLA_RETURN_IF_ERROR(d.Alloc(&d.inv_freq, inv_freq.size()));
    FLOTILLA_CUDA_RETURN(cudaMemcpyAsync(d.inv_freq, inv_freq.data(),
                                         inv_freq.size() * sizeof(float), cudaMemcpyHostToDevice, s));
  }

  // Step buffers.
  const int T = options.max_batch_tokens, B = options.max_sequences;
  d.max_tokens = T;
  d.max_seqs = B;
  d.logit_rows = std::max(B, 64);
  FLOTILLA_RETURN_IF_ERROR(d.Alloc(&d.x, T * H));
  FLOTILLA_RETURN_IF_ERROR(d.Alloc(&d.t, T * H));
  FLOTILLA_RETURN_IF_ERROR(d.Alloc(&d.qkv, T * QKV));
  FLOTILLA_RETURN_IF_ERROR(d.Alloc(&d.q, T * NH * D));
  FLOTILLA_RETURN_IF_ERROR(d.Alloc(&d.attn, T * NH * D));
  FLOTILLA_RETURN_IF_ERROR(d.Alloc(&d.router_logits, T * E));
  FLOTILLA_RETURN_IF_ERROR(d.Alloc(&d.topk_ids, T * K));
  FLOTILLA_RETURN_IF_ERROR(d.Alloc(&d.topk_w, T * K));
  d.max_slots = shard.max_slots;
  if (options.parallel != nullptr && !shard.moe_tp) {
    const size_t counters = static_cast<size_t>(c.num_hidden_layers) * shard.max_slots;
    FLOTILLA_RETURN_IF_ERROR(d.Alloc(&d.expert_counts, counters));
    FLOTILLA_CUDA_RETURN(cudaMemsetAsync(d.expert_counts, 0, counters * sizeof(uint32_t), s));
    FLOTILLA_CUDA_RETURN(cudaMallocHost(reinterpret_cast<void**>(&d.expert_counts_host),
                                        counters * sizeof(uint32_t)));
    FLOTILLA_CUDA_RETURN(cudaEventCreateWithFlags(&d.counts_event, cudaEventDisableTiming));
  }
  FLOTILLA_CUDA_RETURN(cudaMemsetAsync(d.router_logits, 0, static_cast<size_t>(T) * E * sizeof(float), s));
  if (options.record_routing) {
    FLOTILLA_RETURN_IF_ERROR(d.Alloc(&d.routing_record, static_cast<size_t>(c.num_hidden_layers) * T * K));
  }
  FLOTILLA_RETURN_IF_ERROR(d.Alloc(&d.final_t, d.logit_rows * H));
  FLOTILLA_RETURN_IF_ERROR(d.Alloc(&d.logits, static_cast<size_t>(d.logit_rows) * V));
  FLOTILLA_RETURN_IF_ERROR(d.Alloc(&d.invalid, 1));
  if (options.parallel != nullptr) {
    FLOTILLA_RETURN_IF_ERROR(d.Alloc(&d.o_part, static_cast<size_t>(T) * H));
    FLOTILLA_RETURN_IF_ERROR(d.Alloc(&d.moe_y, static_cast<size_t>(T) * H));
  }
  if (options.parallel != nullptr && !shard.moe_tp) {
    // Rows a rank can receive in one dispatch: from each of the W ranks, its
    // share of a step's tokens times K (the device context's capacity).
    const int W = options.parallel->config().world_size();
    d.moe_rows = static_cast<size_t>(W) * CeilDiv(T, shard.tp_size) * K;
    d.moe_ws_bytes = kc::MoeWorkspaceBytes(d.layers[0].moe, static_cast<int>(d.moe_rows), 1);
  } else {
    d.moe_rows = static_cast<size_t>(T) * K;
    d.moe_ws_bytes = kc::MoeWorkspaceBytes(d.layers[0].moe, T, static_cast<int>(K));
  }
  FLOTILLA_RETURN_IF_ERROR(d.Alloc(reinterpret_cast<uint8_t**>(&d.moe_ws), d.moe_ws_bytes));
  d.sample_ws_bytes = kc::SampleWorkspaceBytes(B, static_cast<int>(V));
  FLOTILLA_RETURN_IF_ERROR(d.Alloc(reinterpret_cast<uint8_t**>(&d.sample_ws), d.sample_ws_bytes));
  FLOTILLA_RETURN_IF_ERROR(d.Alloc(&d.sampled_tokens, B));
  FLOTILLA_RETURN_IF_ERROR(d.Alloc(&d.sampled_logprobs, B));
  FLOTILLA_RETURN_IF_ERROR(d.Alloc(&d.sample_params, B));
  FLOTILLA_RETURN_IF_ERROR(d.AllocSamplingExtras(B, c.vocab_size));

  // KV arena: a block holds K and V of every layer of one group (full or
  // sliding layers); the layers of a group index their own arrays with it.
  const int64_t bs = options.kv_block_size;
  KvBlockAllocatorOptions kv_options = KvGroups(c, options);
  d.kv_groups = static_cast<int>(kv_options.sliding.size());
  std::vector<int> in_group(d.kv_groups, 0);
  for (Impl::Layer& L : d.layers) {
    L.kv_group = d.kv_groups == 2 && L.window > 0 ? 1 : 0;
    ++in_group[L.kv_group];
  }
  const int64_t group_layers = *std::max_element(in_group.begin(), in_group.end());
  const size_t layer_block_elems = static_cast<size_t>(NKV) * bs * D;  // K or V of one layer
  const size_t block_bytes = 2 * layer_block_elems * group_layers * sizeof(uint16_t);
  int64_t max_context = options.max_context > 0
                            ? std::min<int64_t>(options.max_context, c.max_position_embeddings)
                            : c.max_position_embeddings;
  int64_t num_blocks = options.kv_num_blocks > 0 ? options.kv_num_blocks + 1 : 0;
  // Attention scratch for any step: the split count depends on the batch
  // (fewer sequences, more splits), so take the largest over every shape.
  d.attn_ws_bytes = 0;
  for (int b = 1; b <= B; ++b) {
    for (int q = 1; q <= 8 && q * b <= T; ++q) {
      kc::AttentionBatch probe;
      probe.batch = b;
      probe.total_q = q * b;
      probe.max_seq_len = static_cast<int>(max_context);
      probe.max_q_per_seq = q;
      probe.max_blocks_per_seq = static_cast<int>(CeilDiv(max_context, bs));
      d.attn_ws_bytes = std::max(
          d.attn_ws_bytes, kc::AttentionWorkspaceBytes(probe, static_cast<int>(NH), static_cast<int>(D)));
    }
  }
  FLOTILLA_RETURN_IF_ERROR(d.Alloc(reinterpret_cast<uint8_t**>(&d.attn_ws), d.attn_ws_bytes));
  // The split-KV merge keeps its arrival counters here; they start at zero
  // and every launch leaves them so.
  FLOTILLA_CUDA_RETURN(cudaMemsetAsync(d.attn_ws, 0, d.attn_ws_bytes, s));
  if (num_blocks == 0) {
    size_t free_bytes = 0, total_bytes = 0;
    FLOTILLA_CUDA_RETURN(cudaStreamSynchronize(s));
    FLOTILLA_CUDA_RETURN(cudaMemGetInfo(&free_bytes, &total_bytes));
    // This engine's share of the device (several ranks may share one GPU):
    // gpu_memory_utilization of it, less what the engine holds already and
    // room for the CUDA context, block tables, graphs and cuBLASLt; never
    // more than is free now.
    constexpr double kContextReserve = 768.0 * (1 << 20);
    const double budget = static_cast<double>(total_bytes) * options.gpu_memory_utilization -
                          static_cast<double>(d.allocated_bytes) - kContextReserve;
    const double free_now = static_cast<double>(free_bytes) - kContextReserve / 2;
    const double usable = std::max(0.0, std::min(budget, free_now));
    num_blocks = static_cast<int64_t>(usable / static_cast<double>(block_bytes));
    kv_options.num_blocks = 1;  // BlocksForLength does not depend on it
    FLOTILLA_ASSIGN_OR_RETURN(std::unique_ptr<KvBlockAllocator> probe,
                              KvBlockAllocator::Create(kv_options));
    num_blocks = std::min<int64_t>(num_blocks, probe->BlocksForLength(max_context) * B + 1);
  }
  if (num_blocks < 2) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "cuda engine: no memory left for the KV cache (a block of ", bs, " positions takes ",
        block_bytes, " bytes over the ", group_layers, " layers of a group)"));
  }
  FLOTILLA_RETURN_IF_ERROR(d.Alloc(&d.kv_arena, num_blocks * block_bytes / sizeof(uint16_t)));
  // Pseudo-random contents: padded graph rows and ExtendSynthetic read them.
  FLOTILLA_CUDA_RETURN(kc::LaunchFillBf16(d.kv_arena, num_blocks * block_bytes / sizeof(uint16_t),
                                          seed + 77, 1.0f, 0.0f, s));
  std::fill(in_group.begin(), in_group.end(), 0);
  for (Impl::Layer& L : d.layers) {
    const size_t i = in_group[L.kv_group]++;  // its index among its group's layers
    kc::PagedKvLayer& kv = L.kv;
    kv.k = d.kv_arena + (2 * i) * num_blocks * layer_block_elems;
    kv.v = d.kv_arena + (2 * i + 1) * num_blocks * layer_block_elems;
    kv.num_blocks = static_cast<int>(num_blocks);
    kv.block_size = static_cast<int>(bs);
    kv.kv_heads = static_cast<int>(NKV);
    kv.head_dim = static_cast<int>(D);
  }
  // Block 0 is scratch; the allocator hands out the others low to high.
  kv_options.first_block = 1;
  kv_options.num_blocks = num_blocks - 1;
  FLOTILLA_ASSIGN_OR_RETURN(std::unique_ptr<KvBlockAllocator> kv,
                            KvBlockAllocator::Create(kv_options));
  max_context = std::min<int64_t>(max_context, kv->MaxTokens());
  const int64_t max_blocks_per_seq = CeilDiv(max_context, bs);

  // Metadata regions at fixed offsets.
  d.meta_at = StepMetaOffsets::For(T, B, d.logit_rows, d.kv_groups, max_blocks_per_seq);
  FLOTILLA_RETURN_IF_ERROR(d.Alloc(&d.meta, d.meta_at.total));
  FLOTILLA_CUDA_RETURN(
      cudaMallocHost(reinterpret_cast<void**>(&d.meta_host), d.meta_at.total * sizeof(int32_t)));
  FLOTILLA_CUDA_RETURN(cudaMallocHost(reinterpret_cast<void**>(&d.params_host), B * sizeof(kc::SamplingRow)));
  FLOTILLA_CUDA_RETURN(cudaMallocHost(reinterpret_cast<void**>(&d.tokens_host), B * sizeof(int32_t)));
  FLOTILLA_CUDA_RETURN(cudaMallocHost(reinterpret_cast<void**>(&d.logprobs_host), B * sizeof(float)));
  FLOTILLA_CUDA_RETURN(cudaStreamSynchronize(s));

  std::unique_ptr<CudaEngine> engine(new CudaEngine(std::move(impl), c));
  engine->options_ = options;
  engine->options_.max_context = max_context;
  engine->max_blocks_per_seq_ = max_blocks_per_seq;
  engine->weight_bytes_ = weight_bytes;
  engine->kv_ = std::move(kv);
  return engine;
}

size_t CudaEngine::decode_bytes_per_token() const {
  const ModelConfig& c = config_;
  const size_t H = c.hidden_size, D = c.head_dim, NH = c.num_attention_heads,
               NKV = c.num_key_value_heads, E = c.num_local_experts, K = c.num_experts_per_tok;
  const size_t dense = ((NH + 2 * NKV) * D * H + H * NH * D + E * H) * 2;
  return c.num_hidden_layers * (dense + K * impl_->layers[0].moe.ExpertBytes()) +
         static_cast<size_t>(c.vocab_size) * H * 2;
}

int64_t CudaEngine::NewSequence() { return kv_->CreateSequence(); }

absl::Status CudaEngine::FreeSequence(int64_t sequence) {
  if (!kv_->Contains(sequence)) {
    return absl::InvalidArgumentError(absl::StrCat("unknown sequence ", sequence));
  }
  return kv_->Free(sequence);
}

absl::StatusOr<int64_t> CudaEngine::SequenceLength(int64_t sequence) const {
  if (!kv_->Contains(sequence)) {
    return absl::InvalidArgumentError(absl::StrCat("unknown sequence ", sequence));
  }
  return kv_->Length(sequence);
}

int64_t CudaEngine::CachedPrefixLength(const std::vector<int32_t>& prompt,
                                       uint64_t cache_domain) const {
  if (prompt.size() < 2) return 0;
  const int64_t bs = options_.kv_block_size;
  const int64_t max_blocks = std::min<int64_t>((static_cast<int64_t>(prompt.size()) - 1) / bs,
                                               max_blocks_per_seq_);
  return kv_->MatchPrefix(prompt, max_blocks, cache_domain) * bs;
}

absl::StatusOr<int64_t> CudaEngine::NewSequenceWithPrefix(const std::vector<int32_t>& prefix,
                                                          uint64_t cache_domain) {
  return kv_->CreateSequenceFromPrefix(prefix, cache_domain);
}

int64_t CudaEngine::MaxSequenceLength() const { return options_.max_context; }

absl::Status CudaEngine::Validate(const std::vector<StepItem>& items) const {
  if (items.empty()) {
    // A sharded rank with no work runs an empty step to join its peers.
    if (options_.parallel != nullptr) return absl::OkStatus();
    return absl::InvalidArgumentError("step: no sequences");
  }
  if (static_cast<int64_t>(items.size()) > options_.max_sequences) {
    return absl::InvalidArgumentError(absl::StrCat("step: ", items.size(),
                                                   " sequences, more than max_sequences ",
                                                   options_.max_sequences));
  }
  std::unordered_set<int64_t> seen;
  int64_t tokens = 0, needed = 0;
  for (const StepItem& it : items) {
    FLOTILLA_RETURN_IF_ERROR(
        CheckStepItem(it, kv_->Contains(it.sequence), config_.vocab_size, &seen));
    const int64_t n = static_cast<int64_t>(it.tokens.size());
    tokens += n;
    const int64_t length = *kv_->Length(it.sequence) + n;
    if (length > options_.max_context) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sequence ", it.sequence, " would hold ", length,
          " tokens, more than this engine's context (", options_.max_context, ")"));
    }
    needed += *kv_->BlocksNeeded(it.sequence, n);
  }
  if (tokens > options_.max_batch_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("step: ", tokens,
                                                   " tokens, more than max_batch_tokens ",
                                                   options_.max_batch_tokens));
  }
  if (needed > free_kv_blocks()) {
    return absl::ResourceExhaustedError(absl::StrCat("kv cache: out of blocks: the step needs ",
                                                     needed, " blocks, ", free_kv_blocks(), " of ",
                                                     num_kv_blocks(), " are free"));
  }
  return absl::OkStatus();
}

absl::Status CudaEngine::Reserve(const std::vector<StepItem>& items) {
  for (const StepItem& it : items) {
    FLOTILLA_RETURN_IF_ERROR(ReserveKv(it.sequence, static_cast<int64_t>(it.tokens.size())));
  }
  return absl::OkStatus();
}

absl::Status CudaEngine::ReserveKv(int64_t sequence, int64_t tokens) {
  Impl& d = *impl_;
  cudaError_t copied = cudaSuccess;
  // Copy on write of a shared block, every layer's K and V (the prefix cache
  // shares only whole blocks, which are never written again, so this is for
  // completeness).
  auto copy = [&](int32_t from, int32_t to) {
    for (const Impl::Layer& L : d.layers) {
      const size_t n = static_cast<size_t>(L.kv.kv_heads) * L.kv.block_size * L.kv.head_dim;
      for (uint16_t* base : {L.kv.k, L.kv.v}) {
        const cudaError_t e = cudaMemcpyAsync(base + to * n, base + from * n, n * sizeof(uint16_t),
                                              cudaMemcpyDeviceToDevice, d.stream);
        if (e != cudaSuccess) copied = e;
      }
    }
  };
  FLOTILLA_RETURN_IF_ERROR(kv_->Reserve(sequence, tokens, copy));
  return CudaStatus(copied, "kv cache: copy a shared block");
}

absl::Status CudaEngine::ExtendSynthetic(int64_t sequence, int64_t tokens) {
  absl::StatusOr<int64_t> length = SequenceLength(sequence);
  if (!length.ok()) return length.status();
  if (tokens < 0 || *length + tokens > options_.max_context) {
    return absl::InvalidArgumentError("extend: past this engine's context");
  }
  FLOTILLA_RETURN_IF_ERROR(ReserveKv(sequence, tokens));
  return kv_->Commit(sequence, tokens, nullptr);  // its KV is not its tokens'
}

absl::StatusOr<StepOutput> CudaEngine::Step(const std::vector<StepItem>& items) {
  bool any_sampler = false, any_all = false;
  for (const StepItem& it : items) {
    any_sampler = any_sampler || it.sampler != nullptr;
    any_all = any_all || it.logits == LogitsMode::kAll;
  }
  StepOutput out;
  if (!any_sampler) {
    FLOTILLA_RETURN_IF_ERROR(RunStep(items, nullptr, &out, nullptr));
    return out;
  }
  PrefetchMasks(items);
  DeviceSampling sampling;
  if (any_all || !PrepareDeviceSampling(items, &sampling)) {
    ++host_sampled_steps_;
    return StepWithHostSampling(items);
  }
  FLOTILLA_RETURN_IF_ERROR(RunStep(items, &sampling, &out, nullptr));
  return out;
}

void CudaEngine::PrefetchMasks(const std::vector<StepItem>& items) {
  std::vector<Sampler*> masked;
  for (const StepItem& it : items) {
    if (it.sampler != nullptr && it.sampler->has_filter()) masked.push_back(it.sampler);
  }
  if (masked.size() < 2) return;
  if (mask_pool_ == nullptr) {
    // Threads of their own: the step's host work waits for the masks anyway.
    const int cores = static_cast<int>(std::thread::hardware_concurrency());
    mask_pool_ = std::make_unique<kernels::cpu::ThreadPool>(std::clamp(cores / 2, 2, 8));
  }
  mask_pool_->ParallelFor(static_cast<int64_t>(masked.size()), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) masked[i]->Allowed();
  });
}

bool CudaEngine::PrepareDeviceSampling(const std::vector<StepItem>& items,
                                       DeviceSampling* sampling) {
  Impl& d = *impl_;
  sampling->rows.assign(items.size(), kc::SamplingRow{});
  sampling->samplers.assign(items.size(), nullptr);
  for (size_t i = 0; i < items.size(); ++i) {
    Sampler* sampler = items[i].sampler;
    if (sampler == nullptr) continue;
    const SamplingParams& p = sampler->params();
    if (const uint32_t* allowed = sampler->Allowed()) {
      if (!StageMask(items[i], static_cast<int>(i), allowed, sampling)) return false;
    }
    kc::SamplingRow& row = sampling->rows[i];
    row.temperature = p.temperature;
    row.top_k = p.top_k;
    row.top_p = p.top_p;
    row.min_p = p.min_p;
    row.seed = sampler->seed();
    row.step = sampler->draws();
    sampling->samplers[i] = sampler;
    sampling->logprobs = sampling->logprobs || p.logprobs;
    sampling->top_n = std::max(sampling->top_n, p.logprobs ? p.top_logprobs : 0);
    for (const LogitAdjustment& a : sampler->Adjustments()) {
      if (sampling->adjustments == Impl::kAdjustCapacity) return false;
      d.adjust_host[sampling->adjustments++] =
          kc::LogitAdjustmentEntry{static_cast<int32_t>(i), a.token, a.repetition, a.add};
    }
  }
  return true;
}

// A structured-output row's mask goes with the step's inputs (a mask word
// per 32 tokens, ~25 KB at o200k) and the device sets its refused logits to
// -inf before the draw. The host samples instead (false) when the row wants
// logprobs or its logit row (both are of the raw logits, which the mask
// overwrites), or when more rows than mask_capacity are masked.
bool CudaEngine::StageMask(const StepItem& item, int index, const uint32_t* allowed,
                           DeviceSampling* sampling) {
  Impl& d = *impl_;
  if (item.sampler->params().logprobs || item.logits != LogitsMode::kNone) return false;
  // A mask that allows nothing is left out, as the CPU sampler ignores it
  // (the filter reports the failure when the token is recorded).
  if (std::all_of(allowed, allowed + d.mask_words, [](uint32_t w) { return w == 0; })) return true;
  if (sampling->masks == d.mask_capacity) return false;
  std::memcpy(d.masks_host + static_cast<size_t>(sampling->masks) * d.mask_words, allowed,
              d.mask_words * sizeof(uint32_t));
  d.mask_rows_host[sampling->masks++] = index;  // an item index until UploadSampling
  return true;
}

int CudaEngine::SamplingVariant(const DeviceSampling& sampling) {
  const bool adjust = sampling.adjustments > 0;
  const bool masked = sampling.masks > 0;
  return 1 + (adjust ? 2 : 0) + (adjust && sampling.logprobs ? 4 : 0) + (masked ? 8 : 0) +
         16 * sampling.top_n;
}

absl::Status CudaEngine::UploadSampling(const DeviceSampling& sampling, const StepLayout& plan) {
  Impl& d = *impl_;
  for (int r = 0; r < plan.seqs; ++r) d.params_host[r] = kc::SamplingRow{};  // padding: greedy
  for (int i = 0; i < plan.real_items; ++i) {
    if (plan.row_count[i] > 0) d.params_host[plan.first_row[i]] = sampling.rows[i];
  }
  FLOTILLA_CUDA_RETURN(cudaMemcpyAsync(d.sample_params, d.params_host,
                                       std::max(plan.rows, 1) * sizeof(kc::SamplingRow),
                                       cudaMemcpyHostToDevice, d.stream));
  FLOTILLA_RETURN_IF_ERROR(UploadMasks(sampling, plan));
  if (sampling.adjustments == 0) return absl::OkStatus();
  // Item indices to logit rows; the count travels after the entries.
  for (int e = 0; e < sampling.adjustments; ++e) {
    d.adjust_host[e].row = plan.first_row[d.adjust_host[e].row];
  }
  int32_t* count = reinterpret_cast<int32_t*>(d.adjust_host + Impl::kAdjustCapacity);
  *count = sampling.adjustments;
  FLOTILLA_CUDA_RETURN(cudaMemcpyAsync(d.adjust, d.adjust_host,
                                       sampling.adjustments * sizeof(kc::LogitAdjustmentEntry),
                                       cudaMemcpyHostToDevice, d.stream));
  FLOTILLA_CUDA_RETURN(cudaMemcpyAsync(d.adjust_count, count, sizeof(int32_t),
                                       cudaMemcpyHostToDevice, d.stream));
  return absl::OkStatus();
}

absl::Status CudaEngine::UploadMasks(const DeviceSampling& sampling, const StepLayout& plan) {
  Impl& d = *impl_;
  if (sampling.masks == 0) return absl::OkStatus();
  for (int m = 0; m < sampling.masks; ++m) {
    d.mask_rows_host[m] = plan.first_row[d.mask_rows_host[m]];
  }
  d.mask_rows_host[d.mask_capacity] = sampling.masks;
  FLOTILLA_CUDA_RETURN(cudaMemcpyAsync(
      d.masks, d.masks_host, static_cast<size_t>(sampling.masks) * d.mask_words * sizeof(uint32_t),
      cudaMemcpyHostToDevice, d.stream));
  FLOTILLA_CUDA_RETURN(cudaMemcpyAsync(d.mask_rows, d.mask_rows_host,
                                       (d.mask_capacity + 1) * sizeof(int32_t),
                                       cudaMemcpyHostToDevice, d.stream));
  return absl::OkStatus();
}

// Masks go first: the rows they cover report no logprobs (StageMask), so
// the raw-logprob passes below never need their refused logits back.
// Without adjustments one draw reports the raw logprobs itself. With them the
// draw runs on the adjusted rows, which are then restored, and a greedy draw
// over the raw rows gives the top logprobs and the normaliser for the drawn
// token's raw logprob (OpenAI and the CPU sampler report raw logprobs).
absl::Status CudaEngine::LaunchSampling(const DeviceSampling& sampling, int rows,
                                        cudaStream_t s) {
  Impl& d = *impl_;
  const int V = config_.vocab_size, cap = Impl::kAdjustCapacity;
  if (sampling.masks > 0) {
    FLOTILLA_CUDA_RETURN(kc::LaunchMaskLogits(d.logits, V, d.mask_rows, d.masks,
                                              d.mask_rows + d.mask_capacity,
                                              d.mask_capacity, s));
  }
  if (sampling.adjustments == 0) {
    FLOTILLA_CUDA_RETURN(kc::LaunchSample(d.logits, rows, V, d.sample_params, d.sampled_tokens,
                                          d.sampled_logprobs, sampling.top_n, d.top_ids,
                                          d.top_logprobs, d.sample_ws, d.sample_ws_bytes, s));
    return absl::OkStatus();
  }
  FLOTILLA_CUDA_RETURN(
      kc::LaunchAdjustLogits(d.logits, V, d.adjust, d.adjust_count, cap, d.adjust_saved, s));
  FLOTILLA_CUDA_RETURN(kc::LaunchSample(d.logits, rows, V, d.sample_params, d.sampled_tokens,
                                        nullptr, 0, nullptr, nullptr, d.sample_ws,
                                        d.sample_ws_bytes, s));
  FLOTILLA_CUDA_RETURN(
      kc::LaunchRestoreLogits(d.logits, V, d.adjust, d.adjust_count, cap, d.adjust_saved, s));
  if (!sampling.logprobs) return absl::OkStatus();
  FLOTILLA_CUDA_RETURN(kc::LaunchSample(d.logits, rows, V, d.greedy_params, d.ref_tokens,
                                        d.ref_logprobs, sampling.top_n, d.top_ids, d.top_logprobs,
                                        d.sample_ws, d.sample_ws_bytes, s));
  FLOTILLA_CUDA_RETURN(kc::LaunchLogprobsFromReference(d.logits, rows, V, d.sampled_tokens,
                                                       d.ref_tokens, d.ref_logprobs,
                                                       d.sampled_logprobs, s));
  return absl::OkStatus();
}

// Brings back the drawn tokens (and logprobs, and the logit rows asked for
// beside them) and records the tokens in their samplers.
absl::Status CudaEngine::WaitForStep(cudaStream_t stream) {
  if (options_.parallel == nullptr) {
    return CudaStatus(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  }
  // A sharded step waits through its context: a peer that died inside an
  // exchange must not hold this thread forever.
  const absl::Status waited = options_.parallel->WaitForStream(stream);
  if (!waited.ok()) {
    AbortExchanges();
    cudaStreamSynchronize(stream);  // the aborted kernels have exited
  }
  return waited;
}

void CudaEngine::AbortExchanges() {
  // NCCL aborts a communicator only once every graph that captured it is
  // destroyed; an exec destroyed while it runs is freed when it completes,
  // which the abort itself brings about.
  cudaSetDevice(impl_->device);
  for (auto& [key, exec] : impl_->graphs) cudaGraphExecDestroy(exec);
  impl_->graphs.clear();
  options_.parallel->Abort();
}

absl::Status CudaEngine::CollectSampled(const std::vector<StepItem>& items,
                                        const DeviceSampling& sampling, const StepLayout& plan,
                                        StepOutput* out, std::vector<SampledToken>* sampled) {
  Impl& d = *impl_;
  const int V = config_.vocab_size, rows = plan.rows, top = sampling.top_n;
  cudaStream_t s = d.stream;
  FLOTILLA_CUDA_RETURN(cudaMemcpyAsync(d.tokens_host, d.sampled_tokens, rows * sizeof(int32_t),
                                       cudaMemcpyDeviceToHost, s));
  FLOTILLA_CUDA_RETURN(cudaMemcpyAsync(d.logprobs_host, d.sampled_logprobs, rows * sizeof(float),
                                       cudaMemcpyDeviceToHost, s));
  if (top > 0) {
    FLOTILLA_CUDA_RETURN(cudaMemcpyAsync(d.top_ids_host, d.top_ids,
                                         static_cast<size_t>(rows) * top * sizeof(int32_t),
                                         cudaMemcpyDeviceToHost, s));
    FLOTILLA_CUDA_RETURN(cudaMemcpyAsync(d.top_logprobs_host, d.top_logprobs,
                                         static_cast<size_t>(rows) * top * sizeof(float),
                                         cudaMemcpyDeviceToHost, s));
  }
  if (out != nullptr) {
    out->logits.assign(items.size(), {});
    for (size_t i = 0; i < items.size(); ++i) {
      if (items[i].logits != LogitsMode::kLast || plan.row_count[i] == 0) continue;
      out->logits[i].resize(V);
      FLOTILLA_CUDA_RETURN(cudaMemcpyAsync(out->logits[i].data(),
                                           d.logits + static_cast<size_t>(plan.first_row[i]) * V,
                                           V * sizeof(float), cudaMemcpyDeviceToHost, s));
    }
  }
  FLOTILLA_RETURN_IF_ERROR(WaitForStep(s));
  if (sampled != nullptr) {
    sampled->resize(plan.real_items);
    for (int i = 0; i < plan.real_items; ++i) {
      const int r = plan.first_row[i];
      (*sampled)[i] = SampledToken{d.tokens_host[r], d.logprobs_host[r]};
    }
  }
  if (out == nullptr) return absl::OkStatus();
  out->sampled.assign(items.size(), TokenLogprob{});
  for (size_t i = 0; i < items.size(); ++i) {
    Sampler* sampler = sampling.samplers[i];
    if (sampler == nullptr) continue;
    const int r = plan.first_row[i];
    TokenLogprob& drawn = out->sampled[i];
    drawn.token = d.tokens_host[r];
    drawn.logprob = d.logprobs_host[r];
    const int n = sampler->params().logprobs ? sampler->params().top_logprobs : 0;
    for (int j = 0; j < n; ++j) {
      const size_t at = static_cast<size_t>(r) * top + j;
      drawn.top.emplace_back(d.top_ids_host[at], d.top_logprobs_host[at]);
    }
    sampler->Record(drawn.token);
  }
  return absl::OkStatus();
}

absl::StatusOr<StepOutput> CudaEngine::StepWithHostSampling(const std::vector<StepItem>& items) {
  std::vector<StepItem> plain = items;
  for (StepItem& it : plain) {
    if (it.sampler != nullptr && it.logits == LogitsMode::kNone) it.logits = LogitsMode::kLast;
    it.sampler = nullptr;
  }
  StepOutput out;
  FLOTILLA_RETURN_IF_ERROR(RunStep(plain, nullptr, &out, nullptr));
  const int64_t V = config_.vocab_size;
  out.sampled.resize(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    Sampler* sampler = items[i].sampler;
    if (sampler == nullptr) continue;
    const float* last = out.logits[i].data() + out.logits[i].size() - V;
    TokenLogprob& drawn = out.sampled[i];
    drawn.token = sampler->Sample(last, sampler->params().logprobs ? &drawn : nullptr);
    if (items[i].logits == LogitsMode::kNone) out.logits[i].clear();
  }
  return out;
}

absl::StatusOr<std::vector<SampledToken>> CudaEngine::StepAndSample(
    const std::vector<StepItem>& items, const std::vector<kernels::cuda::SamplingRow>& params) {
  if (params.size() != items.size()) {
    return absl::InvalidArgumentError("step: one sampling row per item is needed");
  }
  DeviceSampling sampling;
  sampling.rows = params;
  sampling.samplers.assign(items.size(), nullptr);
  std::vector<SampledToken> sampled;
  FLOTILLA_RETURN_IF_ERROR(RunStep(items, &sampling, nullptr, &sampled));
  return sampled;
}

void CudaEngine::SetSkipOps(std::vector<std::string> ops) {
  options_.skip_ops = std::move(ops);
  cudaSetDevice(impl_->device);
  cudaStreamSynchronize(impl_->stream);
  for (auto& [key, exec] : impl_->graphs) cudaGraphExecDestroy(exec);
  impl_->graphs.clear();
}

absl::Status CudaEngine::RunShardedMoe(int layer, int tokens, cudaStream_t stream) {
  Impl& d = *impl_;
  parallel::ExpertParallel& ep = options_.parallel->ep();
  FLOTILLA_ASSIGN_OR_RETURN(const parallel::ExpertRows rows,
                            ep.Dispatch(layer, d.t, d.topk_ids, d.topk_w, tokens, stream));
  if (rows.rows < 0 || static_cast<size_t>(rows.rows) > d.moe_rows) {
    return absl::InternalError(absl::StrCat("layer ", layer, ": dispatch gave ", rows.rows,
                                            " rows; the MoE workspace holds ", d.moe_rows));
  }
  if (d.expert_counts != nullptr && rows.rows > 0) {
    FLOTILLA_CUDA_RETURN(kc::LaunchCountExpertRows(
        rows.slot, rows.rows, d.max_slots,
        d.expert_counts + static_cast<size_t>(layer) * d.max_slots, stream));
  }
  // The rows' weights are 1 (0 for padding): the outputs stay unweighted and
  // Combine applies the router weights.
  if (rows.rows > 0) {
    FLOTILLA_CUDA_RETURN(kc::LaunchMoeLayer(
        d.layers[layer].moe, static_cast<const uint16_t*>(rows.x), rows.slot, rows.ones,
        static_cast<int>(rows.rows), 1, static_cast<float>(config_.swiglu_limit), 1.702f,
        rows.out, d.moe_ws, d.moe_ws_bytes, nullptr, stream));
  }
  FLOTILLA_RETURN_IF_ERROR(ep.Combine(layer, d.moe_y, stream));
  FLOTILLA_CUDA_RETURN(kc::LaunchAddInPlace(
      d.x, d.moe_y, static_cast<size_t>(tokens) * config_.hidden_size, stream));
  return absl::OkStatus();
}

absl::Status CudaEngine::RunTensorParallelMoe(int layer, int tokens, cudaStream_t stream) {
  Impl& d = *impl_;
  const kc::MoeDeviceWeights& moe = d.layers[layer].moe;
  const size_t n = static_cast<size_t>(tokens) * config_.hidden_size;
  FLOTILLA_CUDA_RETURN(cudaMemsetAsync(d.moe_y, 0, n * sizeof(float), stream));
  FLOTILLA_CUDA_RETURN(kc::LaunchMoeLayer(moe, d.t, d.topk_ids, d.topk_w, tokens,
                                          config_.num_experts_per_tok,
                                          static_cast<float>(config_.swiglu_limit), 1.702f, d.moe_y,
                                          d.moe_ws, d.moe_ws_bytes, d.invalid, stream));
  FLOTILLA_RETURN_IF_ERROR(
      options_.parallel->tp().AllReduce(d.moe_y, static_cast<int64_t>(n), stream));
  FLOTILLA_CUDA_RETURN(kc::LaunchAddInPlace(d.x, d.moe_y, n, stream));
  return absl::OkStatus();
}

absl::Status CudaEngine::RunStep(const std::vector<StepItem>& items,
                                 const DeviceSampling* sampling, StepOutput* logits_out,
                                 std::vector<SampledToken>* sampled) {
  const bool sample = sampling != nullptr;
  // With sampling, every item that samples (or asks for its last logits)
  // owns one row; StepAndSample's items (no samplers) all sample.
  auto has_row = [&](size_t i) {
    return items[i].logits != LogitsMode::kNone || !sample || sampling->samplers[i] != nullptr ||
           !logits_out;
  };
  FLOTILLA_RETURN_IF_ERROR(Validate(items));
  Impl& d = *impl_;
  const ModelConfig& c = config_;
  parallel::ParallelContext* par = options_.parallel;
  const int tp = par != nullptr ? par->config().tp_size() : 1;
  const bool moe_tp = par != nullptr && par->config().moe_tp();
  // This rank's heads (all of them without tensor parallelism).
  const int H = c.hidden_size, D = c.head_dim, NH = c.num_attention_heads / tp;
  const int E = c.num_local_experts, K = c.num_experts_per_tok, V = c.vocab_size;
  const int QKV = (NH + 2 * c.num_key_value_heads / tp) * D;
  const float eps = static_cast<float>(c.rms_norm_eps);
  const int bs = options_.kv_block_size;
  const int MB = static_cast<int>(max_blocks_per_seq_);
  FLOTILLA_CUDA_RETURN(cudaSetDevice(d.device));
  FLOTILLA_RETURN_IF_ERROR(Reserve(items));

  // Decode steps replay a graph over a padded batch (StepLayout::Plan).
  // A rank of a sharded instance whose items ask for no logits (a TP peer of
  // the leader) replays such graphs too, without logit rows. An idle sharded
  // rank's empty step (it only joins its peers' exchanges) replays a
  // one-padding-row graph too: launched eagerly, NCCL's enqueue of 72
  // exchanges costs more than the busy peer's whole step.
  std::vector<LogitsMode> modes(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    modes[i] = sample ? (has_row(i) ? LogitsMode::kLast : LogitsMode::kNone) : items[i].logits;
  }
  StepLayoutOptions layout_options;
  layout_options.max_sequences = options_.max_sequences;
  layout_options.block_size = bs;
  layout_options.graphs = options_.cuda_graphs && !options_.profile_ops;
  layout_options.sharded = par != nullptr;
  FLOTILLA_ASSIGN_OR_RETURN(
      const StepLayout plan,
      StepLayout::Plan(items, modes, sample, *kv_, d.meta_at, layout_options, d.meta_host));
  const bool decode = plan.decode, pad_rows = plan.pad_rows;
  const int T = plan.tokens;
  // Sharded: every rank sizes the step's exchanges from the same bound, the
  // instance's largest step rounded up as decode batches are (so it covers
  // this rank's padded rows too).
  int64_t step_bound = 0;
  if (par != nullptr) {
    FLOTILLA_ASSIGN_OR_RETURN(
        step_bound, ShardedStepBound(instance_step_tokens_, T, options_.max_batch_tokens));
    par->ep().SetStepTokens(step_bound);
  }

  // Upload the used part of each region (offsets are fixed).
  for (const auto& [offset, count] : plan.UsedRegions(d.meta_at)) {
    FLOTILLA_CUDA_RETURN(cudaMemcpyAsync(d.meta + offset, d.meta_host + offset,
                                         count * sizeof(int32_t), cudaMemcpyHostToDevice,
                                         d.stream));
  }
  if (sample) FLOTILLA_RETURN_IF_ERROR(UploadSampling(*sampling, plan));

  // The body of the step; `ctx` bounds the sequence lengths for the KV split.
  // Per-op timing (CudaEngineOptions::profile_ops): an event before each op.
  std::vector<std::pair<std::string, cudaEvent_t>> marks;
  auto mark = [&](const char* label) -> absl::Status {
    if (!options_.profile_ops) return absl::OkStatus();
    cudaEvent_t ev = nullptr;
    FLOTILLA_CUDA_RETURN(cudaEventCreate(&ev));
    marks.emplace_back(label, ev);
    return CudaStatus(cudaEventRecord(ev, d.stream), "profile event");
  };
  // Ablation (CudaEngineOptions::skip_ops): false for an op left out.
  auto on = [&](const char* op) {
    return std::find(options_.skip_ops.begin(), options_.skip_ops.end(), op) ==
           options_.skip_ops.end();
  };
  auto forward = [&](int64_t ctx, int logit_rows_now, int row_offset) -> absl::Status {
    cudaStream_t s = d.stream;
    kc::AttentionBatch batch;  // block_tables: the layer's group's, set per layer
    batch.max_blocks_per_seq = MB;
    batch.seq_lens = d.meta + d.meta_at.lens;
    batch.q_start = d.meta + d.meta_at.qstart;
    batch.batch = plan.seqs;
    batch.total_q = T;
    batch.max_seq_len = static_cast<int>(ctx);
    batch.max_q_per_seq = plan.max_q;
    const float scale = 1.0f / std::sqrt(static_cast<float>(D));
    const bool fused_qkv = T <= options_.fused_qkv_max_tokens &&
                           T <= kc::kNormQkvRopeMaxTokens && kc::NormQkvRopeSupported(T, H, D);
    FLOTILLA_RETURN_IF_ERROR(mark("embedding"));
    if (T == 0) {
      // A sharded rank with no tokens still takes part in every exchange
      // (the tensor-parallel MoE has none beyond its idle TP group's).
      for (size_t l = 0; l < d.layers.size() && !moe_tp; ++l) {
        FLOTILLA_RETURN_IF_ERROR(RunShardedMoe(static_cast<int>(l), 0, s));
      }
      return mark("end");
    }
    if (on("embedding")) {
      FLOTILLA_CUDA_RETURN(
          kc::LaunchEmbedding(d.embed, V, H, d.meta + d.meta_at.tokens, T, d.x, d.invalid, s));
    }
    auto slots_of = [&](const Impl::Layer& L) {
      return d.meta + d.meta_at.slots + L.kv_group * d.meta_at.slots_stride;
    };
    for (Impl::Layer& L : d.layers) {
      batch.block_tables = d.meta + d.meta_at.tables + L.kv_group * d.meta_at.tables_stride;
      if (fused_qkv) {
        // Few tokens: the input norm, the QKV projection, RoPE and the KV
        // write in one launch (labelled as the projection it mostly is).
        FLOTILLA_RETURN_IF_ERROR(mark("qkv_linear"));
        if (on("qkv_linear")) {
          FLOTILLA_CUDA_RETURN(kc::LaunchNormQkvRope(d.x, L.input_norm, eps, L.wqkv, L.bqkv, T, H,
                                                     NH, d.meta + d.meta_at.pos, slots_of(L),
                                                     d.inv_freq, d.rope_scaling, L.kv, d.q, s));
        }
      } else {
        FLOTILLA_RETURN_IF_ERROR(mark("rmsnorm"));
        if (on("rmsnorm")) {
          FLOTILLA_CUDA_RETURN(kc::LaunchAddRmsNorm(d.x, nullptr, L.input_norm, T, H, eps, d.t, s));
        }
        FLOTILLA_RETURN_IF_ERROR(mark("qkv_linear"));
        if (on("qkv_linear")) {
          FLOTILLA_CUDA_RETURN(kc::LaunchLinear(d.linear, d.t, L.wqkv, L.bqkv, T, H, QKV, false,
                                                d.qkv, s));
        }
        FLOTILLA_RETURN_IF_ERROR(mark("rope_kv_write"));
        if (on("rope_kv_write")) {
          FLOTILLA_CUDA_RETURN(kc::LaunchRopeKvWrite(d.qkv, d.meta + d.meta_at.pos, slots_of(L), T,
                                                     NH, d.inv_freq, d.rope_scaling, L.kv, d.q, s,
                                                     kc::QkvRowOrder::kRopePairs));
        }
      }
      FLOTILLA_RETURN_IF_ERROR(mark("attention"));
      if (on("attention")) {
        if (D == 64) {
          FLOTILLA_CUDA_RETURN(kc::LaunchAttention(d.q, L.kv, batch, NH, L.sinks, L.window, scale,
                                                   d.attn, d.attn_ws, d.attn_ws_bytes, s));
        } else {
          FLOTILLA_CUDA_RETURN(kc::LaunchAttentionGeneric(d.q, L.kv, batch, NH, L.sinks, L.window,
                                                          scale, d.attn, s));
        }
      }
      FLOTILLA_RETURN_IF_ERROR(mark("o_linear"));
      // Tensor parallel: this rank's heads give a partial O projection, summed
      // over the TP group and added to the residual by the norm below.
      const bool tp_sum = tp > 1;
      if (on("o_linear")) {
        FLOTILLA_CUDA_RETURN(kc::LaunchLinear(d.linear, d.attn, L.wo, L.bo, T, NH * D, H, !tp_sum,
                                              tp_sum ? d.o_part : d.x, s));
      }
      if (tp_sum) {
        FLOTILLA_RETURN_IF_ERROR(mark("tp_all_reduce"));
        FLOTILLA_RETURN_IF_ERROR(par->tp().AllReduce(d.o_part, static_cast<int64_t>(T) * H, s));
      }
      // The router projection adds into zeroed logits (so a few tokens can
      // split its input over many blocks) and the ranking zeroes them again.
      // Few tokens: the norm runs inside the projection, which also writes
      // the normalised rows (the experts' input).
      if (!tp_sum &&
          T <= std::min(options_.fused_router_norm_max_tokens, kc::kNormLinearMaxTokens)) {
        FLOTILLA_RETURN_IF_ERROR(mark("router_linear"));
        if (on("router_linear")) {
          FLOTILLA_CUDA_RETURN(kc::LaunchNormLinear(d.x, L.post_norm, eps, L.router,
                                                    L.router_bias, T, H, E, true,
                                                    d.router_logits, d.t, s));
        }
      } else {
        FLOTILLA_RETURN_IF_ERROR(mark("rmsnorm"));
        if (on("rmsnorm")) {
          FLOTILLA_CUDA_RETURN(kc::LaunchAddRmsNorm(d.x, tp_sum ? d.o_part : nullptr, L.post_norm,
                                                    T, H, eps, d.t, s));
        }
        FLOTILLA_RETURN_IF_ERROR(mark("router_linear"));
        if (on("router_linear")) {
          FLOTILLA_CUDA_RETURN(kc::LaunchLinear(d.linear, d.t, L.router, L.router_bias, T, H, E,
                                                true, d.router_logits, s));
        }
      }
      FLOTILLA_RETURN_IF_ERROR(mark("router_topk"));
      if (on("router_topk")) {
        FLOTILLA_CUDA_RETURN(kc::LaunchRouterTopK(d.router_logits, T, E, K, d.topk_ids, d.topk_w, s,
                                                  /*clear_logits=*/true));
      }
      if (d.routing_record != nullptr) {
        const size_t layer = static_cast<size_t>(&L - d.layers.data());
        FLOTILLA_CUDA_RETURN(cudaMemcpyAsync(d.routing_record + layer * d.max_tokens * K, d.topk_ids,
                                             static_cast<size_t>(T) * K * sizeof(int32_t),
                                             cudaMemcpyDeviceToDevice, s));
      }
      FLOTILLA_RETURN_IF_ERROR(mark("moe"));
      if (moe_tp) {
        FLOTILLA_RETURN_IF_ERROR(
            RunTensorParallelMoe(static_cast<int>(&L - d.layers.data()), T, s));
      } else if (par != nullptr) {
        FLOTILLA_RETURN_IF_ERROR(RunShardedMoe(static_cast<int>(&L - d.layers.data()), T, s));
      } else if (on("moe")) {
        FLOTILLA_CUDA_RETURN(kc::LaunchMoeLayer(L.moe, d.t, d.topk_ids, d.topk_w, T, K,
                                                static_cast<float>(c.swiglu_limit), 1.702f, d.x,
                                                d.moe_ws, d.moe_ws_bytes, d.invalid, s));
      }
    }
    if (logit_rows_now > 0) {
      FLOTILLA_RETURN_IF_ERROR(mark("rmsnorm"));
      if (on("rmsnorm")) {
        FLOTILLA_CUDA_RETURN(kc::LaunchRmsNormRows(d.x, d.meta + d.meta_at.rows + row_offset,
                                                   logit_rows_now, d.final_norm, H, eps, d.final_t,
                                                   s));
      }
      FLOTILLA_RETURN_IF_ERROR(mark("lm_head"));
      if (on("lm_head")) {
        FLOTILLA_CUDA_RETURN(kc::LaunchLinear(d.linear, d.final_t, d.lm_head, nullptr,
                                              logit_rows_now, H, V, false, d.logits, s));
      }
      if (sample) {
        FLOTILLA_RETURN_IF_ERROR(mark("sample"));
        FLOTILLA_RETURN_IF_ERROR(LaunchSampling(*sampling, logit_rows_now, s));
      }
    }
    return mark("end");
  };

  if (decode) {
    const int64_t ctx = DecodeContextBucket(plan.max_len, options_.max_context);
    const std::tuple<int, int64_t, int, int64_t> key(
        plan.seqs, ctx, sample ? SamplingVariant(*sampling) : (pad_rows ? -1 : -2), step_bound);
    auto g = d.graphs.find(key);
    if (g == d.graphs.end()) {
      cudaGraph_t graph = nullptr;
      FLOTILLA_CUDA_RETURN(cudaStreamBeginCapture(d.stream, cudaStreamCaptureModeThreadLocal));
      absl::Status st = forward(ctx, plan.rows, 0);
      cudaError_t end = cudaStreamEndCapture(d.stream, &graph);
      FLOTILLA_RETURN_IF_ERROR(st);
      FLOTILLA_CUDA_RETURN(end);
      cudaGraphExec_t exec = nullptr;
      cudaError_t inst = cudaGraphInstantiate(&exec, graph, 0);
      cudaGraphDestroy(graph);
      FLOTILLA_CUDA_RETURN(inst);
      g = d.graphs.emplace(key, exec).first;
    }
    FLOTILLA_CUDA_RETURN(cudaGraphLaunch(g->second, d.stream));
  } else if (plan.rows <= d.logit_rows) {
    FLOTILLA_RETURN_IF_ERROR(forward(plan.max_len, plan.rows, 0));
  } else {
    // More logit rows than the buffer holds (kAll over a long chunk): the
    // layers once, then lm_head in pieces, copied out one by one.
    FLOTILLA_RETURN_IF_ERROR(forward(plan.max_len, 0, 0));
  }

  if (!marks.empty()) {
    FLOTILLA_RETURN_IF_ERROR(WaitForStep(d.stream));
    for (size_t i = 0; i + 1 < marks.size(); ++i) {
      float ms = 0;
      FLOTILLA_CUDA_RETURN(cudaEventElapsedTime(&ms, marks[i].second, marks[i + 1].second));
      op_time_ms_[marks[i].first] += ms;
    }
    for (auto& [label, ev] : marks) cudaEventDestroy(ev);
  }
  // Results.
  for (size_t i = 0; i < items.size(); ++i) {
    FLOTILLA_RETURN_IF_ERROR(kv_->Commit(items[i].sequence,
                                         static_cast<int64_t>(items[i].tokens.size()),
                                         items[i].tokens.data()));
  }
  std::vector<std::vector<int32_t>> routing;
  if (d.routing_record != nullptr) {
    const int layers = c.num_hidden_layers;
    std::vector<int32_t> all(static_cast<size_t>(layers) * d.max_tokens * K);
    FLOTILLA_CUDA_RETURN(cudaMemcpyAsync(all.data(), d.routing_record, all.size() * sizeof(int32_t),
                                         cudaMemcpyDeviceToHost, d.stream));
    FLOTILLA_RETURN_IF_ERROR(WaitForStep(d.stream));
    int offset = 0;
    for (size_t i = 0; i < items.size(); ++i) {
      const int n = static_cast<int>(items[i].tokens.size());
      std::vector<int32_t> r(static_cast<size_t>(n) * layers * K);
      for (int j = 0; j < n; ++j) {
        for (int l = 0; l < layers; ++l) {
          for (int k = 0; k < K; ++k) {
            r[(static_cast<size_t>(j) * layers + l) * K + k] =
                all[static_cast<size_t>(l) * d.max_tokens * K + static_cast<size_t>(offset + j) * K + k];
          }
        }
      }
      routing.push_back(std::move(r));
      offset += n;
    }
  }
  if (sample) {
    return CollectSampled(items, *sampling, plan, logits_out, sampled);
  }
  std::vector<float> host(static_cast<size_t>(plan.rows) * V);
  if (plan.rows <= d.logit_rows || decode) {
    FLOTILLA_CUDA_RETURN(cudaMemcpyAsync(host.data(), d.logits, host.size() * sizeof(float),
                                         cudaMemcpyDeviceToHost, d.stream));
  } else {
    for (int r0 = 0; r0 < plan.rows; r0 += d.logit_rows) {
      const int n = std::min(d.logit_rows, plan.rows - r0);
      FLOTILLA_CUDA_RETURN(kc::LaunchRmsNormRows(d.x, d.meta + d.meta_at.rows + r0, n, d.final_norm,
                                                 H, eps, d.final_t, d.stream));
      FLOTILLA_CUDA_RETURN(kc::LaunchLinear(d.linear, d.final_t, d.lm_head, nullptr, n, H, V, false,
                                            d.logits, d.stream));
      FLOTILLA_CUDA_RETURN(cudaMemcpyAsync(host.data() + static_cast<size_t>(r0) * V, d.logits,
                                           static_cast<size_t>(n) * V * sizeof(float),
                                           cudaMemcpyDeviceToHost, d.stream));
    }
  }
  FLOTILLA_RETURN_IF_ERROR(WaitForStep(d.stream));
  logits_out->logits.resize(items.size());
  logits_out->routing = std::move(routing);
  for (size_t i = 0; i < items.size(); ++i) {
    logits_out->logits[i].assign(
        host.begin() + static_cast<size_t>(plan.first_row[i]) * V,
        host.begin() + static_cast<size_t>(plan.first_row[i] + plan.row_count[i]) * V);
  }
  return absl::OkStatus();
}

}  // namespace flotilla

namespace flotilla {
namespace {

// [layer][slot] -> the expert `map` puts in that slot of `rank` (-1: none).
std::vector<std::vector<int>> SlotExperts(const ExpertMap& map, int rank, int max_slots) {
  std::vector<std::vector<int>> out(map.num_layers(), std::vector<int>(max_slots, -1));
  for (int l = 0; l < map.num_layers(); ++l) {
    for (int e = 0; e < map.num_experts(); ++e) {
      for (const ExpertLocation& at : map.replicas(l, e)) {
        if (at.rank == rank && at.slot < max_slots) out[l][at.slot] = e;
      }
    }
  }
  return out;
}

}  // namespace

std::vector<uint64_t> CudaEngine::TakeExpertCounts() {
  Impl& d = *impl_;
  if (d.expert_counts == nullptr) return {};
  cudaSetDevice(d.device);
  const int L = config_.num_hidden_layers, E = config_.num_local_experts;
  std::vector<uint64_t> out;
  if (d.counts_pending) {
    if (cudaEventQuery(d.counts_event) == cudaErrorNotReady) return {};
    out.assign(static_cast<size_t>(L) * E, 0);
    for (int l = 0; l < L; ++l) {
      for (int slot = 0; slot < d.max_slots; ++slot) {
        const int e = d.counts_slot_expert[l][slot];
        if (e >= 0) out[l * E + e] += d.expert_counts_host[l * d.max_slots + slot];
      }
    }
    d.counts_pending = false;
  }
  // The next read-back: after this step's kernels, on the same stream.
  const size_t bytes = static_cast<size_t>(L) * d.max_slots * sizeof(uint32_t);
  if (cudaMemcpyAsync(d.expert_counts_host, d.expert_counts, bytes, cudaMemcpyDeviceToHost,
                      d.stream) == cudaSuccess &&
      cudaMemsetAsync(d.expert_counts, 0, bytes, d.stream) == cudaSuccess &&
      cudaEventRecord(d.counts_event, d.stream) == cudaSuccess) {
    d.counts_slot_expert =
        SlotExperts(options_.parallel->expert_map(), options_.parallel->rank(), d.max_slots);
    d.counts_pending = true;
  }
  return out;
}

absl::Status CudaEngine::UploadExperts(const ExpertMap& current, const ExpertMap& next,
                                       const ModelWeights& extra, cudaStream_t stream) {
  Impl& d = *impl_;
  if (options_.parallel == nullptr) {
    return absl::FailedPreconditionError("a single-GPU engine holds every expert already");
  }
  if (options_.parallel->config().moe_tp()) {
    return absl::FailedPreconditionError(
        "the tensor-parallel MoE layout holds a slice of every expert: nothing to move");
  }
  const int rank = options_.parallel->rank();
  if (next.num_layers() != config_.num_hidden_layers ||
      current.num_layers() != config_.num_hidden_layers ||
      static_cast<int>(extra.layers.size()) != config_.num_hidden_layers) {
    return absl::InvalidArgumentError("expert upload: the maps or the experts miss layers");
  }
  const auto now = SlotExperts(current, rank, d.max_slots);
  cudaSetDevice(d.device);
  for (int l = 0; l < next.num_layers(); ++l) {
    for (int e = 0; e < next.num_experts(); ++e) {
      for (const ExpertLocation& at : next.replicas(l, e)) {
        if (at.rank != rank) continue;
        if (at.slot >= d.max_slots) {
          return absl::InvalidArgumentError(absl::StrCat("layer ", l, " slot ", at.slot,
                                                         ": this rank has ", d.max_slots,
                                                         " expert slots"));
        }
        if (now[l][at.slot] == e) continue;
        if (now[l][at.slot] >= 0) {
          return absl::FailedPreconditionError(
              absl::StrCat("layer ", l, " slot ", at.slot, " holds expert ", now[l][at.slot],
                           " in the current map; it cannot take expert ", e, " before the switch"));
        }
        const ExpertWeights* x = nullptr;
        for (const ExpertWeights& w : extra.layers[l].experts) {
          if (w.expert_id == e) x = &w;
        }
        if (x == nullptr) {
          return absl::InvalidArgumentError(
              absl::StrCat("expert upload: no weights for layer ", l, " expert ", e));
        }
        FLOTILLA_CUDA_RETURN(kc::UploadMoeExpert(d.layers[l].moe, at.slot, x->gate_up.blocks,
                                                 x->gate_up.scales, x->gate_up_bias.data,
                                                 x->down.blocks, x->down.scales,
                                                 x->down_bias.data, stream));
      }
    }
  }
  FLOTILLA_CUDA_RETURN(cudaStreamSynchronize(stream));
  return absl::OkStatus();
}

absl::Status CudaEngine::StageExperts(const ExpertMap& current, const ExpertMap& next,
                                      const ModelWeights& extra) {
  Impl& d = *impl_;
  cudaSetDevice(d.device);
  if (d.copy_stream == nullptr) {
    FLOTILLA_CUDA_RETURN(cudaStreamCreateWithFlags(&d.copy_stream, cudaStreamNonBlocking));
  }
  FLOTILLA_RETURN_IF_ERROR(UploadExperts(current, next, extra, d.copy_stream));
  d.staged_version = next.version();
  return absl::OkStatus();
}

absl::Status CudaEngine::InstallExperts(const ExpertMap& next, ModelWeights extra) {
  // Staged on the loader thread already (the normal path); otherwise copied
  // here, between steps.
  if (impl_->staged_version == next.version()) return absl::OkStatus();
  return UploadExperts(options_.parallel->expert_map(), next, extra, impl_->stream);
}

}  // namespace flotilla
