// CudaEngine's sequences and KV bookkeeping, step validation and the host
// wait; the build, the step, the sampling and the expert hot swap are in
// cuda_engine_build.cc, cuda_engine_step.cc, cuda_engine_sampling.cc and
// cuda_engine_experts.cc.
#include "worker/engine/cuda_engine.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <unordered_set>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "kernels/cuda/moe.h"
#include "kernels/cuda/ops.h"
#include "worker/engine/cuda_engine_state.h"
#include "worker/engine/cuda_kv_host_tier.h"
#include "worker/engine/cuda_weight_feed.h"
#include "worker/engine/device_sampler.h"
#include "worker/engine/draft_verify.h"
#include "worker/engine/rank_shard.h"
#include "worker/parallel/parallel_context.h"

namespace flotilla {

namespace kc = kernels::cuda;

CudaDeviceState::~CudaDeviceState() {
  if (device >= 0) cudaSetDevice(device);
  graphs.Clear();
  for (Layer& l : layers) kc::FreeMoeWeights(&l.moe);
  if (arena != nullptr) arena->Release();
  if (hidden_host != nullptr) cudaFreeHost(hidden_host);
  if (counts_event != nullptr) cudaEventDestroy(counts_event);
  if (copy_stream != nullptr) cudaStreamDestroy(copy_stream);
  if (linear != nullptr) kc::DestroyLinearContext(linear);
  if (prefetch_fork != nullptr) cudaEventDestroy(prefetch_fork);
  if (prefetch_join != nullptr) cudaEventDestroy(prefetch_join);
  for (cudaEvent_t e : step_events) {
    if (e != nullptr) cudaEventDestroy(e);
  }
  if (prefetch_stream != nullptr) cudaStreamDestroy(prefetch_stream);
  if (stream != nullptr) cudaStreamDestroy(stream);
}

CudaEngine::CudaEngine(std::unique_ptr<CudaDeviceState> impl, const ModelConfig& config)
    : impl_(std::move(impl)), config_(config) {}

CudaEngine::~CudaEngine() {
  // The generation is over and its peers may be gone: exchanges still in
  // flight (a step that failed half-way) end now instead of holding the
  // teardown, which waits for the device.
  if (impl_ != nullptr && options_.parallel != nullptr) AbortExchanges();
}

size_t CudaEngine::captured_graphs() const { return impl_->graphs.size(); }

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

size_t CudaEngine::decode_bytes_per_token() const {
  const ModelConfig& c = config_;
  const size_t H = c.hidden_size, D = c.head_dim, NH = c.num_attention_heads,
               NKV = c.num_key_value_heads, E = c.num_local_experts, K = c.num_experts_per_tok;
  const size_t dense = ((NH + 2 * NKV) * D * H + H * NH * D + E * H) * 2;
  return c.num_hidden_layers * (dense + K * impl_->layers[0].moe.ExpertBytes()) +
         static_cast<size_t>(c.vocab_size) * H * 2;
}

absl::Status CudaEngine::SetHiddenCapture(std::vector<int> layers) {
  CudaDeviceState& d = *impl_;
  for (int l : layers) {
    if (l < 0 || l >= config_.num_hidden_layers) {
      return absl::InvalidArgumentError(absl::StrCat("hidden-state capture: layer ", l,
                                                     " is not in the model's 0..",
                                                     config_.num_hidden_layers - 1));
    }
  }
  FLOTILLA_CUDA_RETURN(cudaSetDevice(d.device));
  if (d.hidden_host != nullptr) {
    FLOTILLA_CUDA_RETURN(cudaFreeHost(d.hidden_host));
    d.hidden_host = nullptr;
  }
  d.capture_layers.clear();
  if (layers.empty()) return absl::OkStatus();
  const size_t floats =
      layers.size() * static_cast<size_t>(d.max_tokens) * static_cast<size_t>(config_.hidden_size);
  FLOTILLA_CUDA_RETURN(cudaMallocHost(reinterpret_cast<void**>(&d.hidden_host), floats * 4));
  d.capture_layers = std::move(layers);
  return absl::OkStatus();
}

void CudaEngine::CollectHidden(const std::vector<StepItem>& items, StepOutput* out) const {
  const CudaDeviceState& d = *impl_;
  const int64_t H = config_.hidden_size, C = static_cast<int64_t>(d.capture_layers.size());
  const size_t layer_stride = static_cast<size_t>(d.max_tokens) * H;
  out->hidden.resize(items.size());
  int64_t offset = 0;  // the items' tokens are the step's rows, in order
  for (size_t i = 0; i < items.size(); ++i) {
    const int64_t n = static_cast<int64_t>(items[i].tokens.size());
    if (items[i].return_hidden) {
      std::vector<float>& rows = out->hidden[i];
      rows.resize(n * C * H);
      for (int64_t j = 0; j < n; ++j) {
        for (int64_t c = 0; c < C; ++c) {
          std::copy_n(d.hidden_host + c * layer_stride + (offset + j) * H, H,
                      &rows[(j * C + c) * H]);
        }
      }
    }
    offset += n;
  }
}

int64_t CudaEngine::NewSequence() { return kv_->CreateSequence(); }

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
  absl::StatusOr<int64_t> seq = kv_->CreateSequenceFromPrefix(prefix, cache_domain);
  // Blocks copied back from the host tier: a failed copy fails the request.
  if (host_tier_) {
    if (absl::Status copied = host_tier_->TakeError(); !copied.ok()) {
      if (seq.ok()) (void)kv_->Free(*seq);
      return copied;
    }
  }
  return seq;
}

int64_t CudaEngine::MaxSequenceLength() const { return options_.max_context; }

bool CudaEngine::SplitsGroupLogits() const {
  return options_.parallel != nullptr && options_.parallel->tp().size() > 1 &&
         impl_->group_logits != nullptr;
}

int64_t CudaEngine::MaxDeviceSampledRows() const {
  return std::min(impl_->max_seqs, impl_->logit_rows);
}

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
  FLOTILLA_RETURN_IF_ERROR(CheckGroupLogits(items, SplitsGroupLogits()));
  std::unordered_set<int64_t> seen;
  int64_t tokens = 0;
  std::vector<int64_t> needed(kv_->num_pools(), 0);
  for (const StepItem& it : items) {
    FLOTILLA_RETURN_IF_ERROR(
        CheckStepItem(it, kv_->Contains(it.sequence), config_.vocab_size, &seen, VerifiesDrafts()));
    FLOTILLA_RETURN_IF_ERROR(CheckDraft(it));
    if (it.return_hidden && impl_->capture_layers.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "step: sequence ", it.sequence,
          " asks for hidden states, but the engine captures no layer (SetHiddenCapture)"));
    }
    const int64_t n = static_cast<int64_t>(it.tokens.size());
    tokens += n;
    const int64_t added = static_cast<int64_t>(it.accepted_draft.size()) + n;
    const int64_t length = *kv_->Length(it.sequence) + added;
    if (length > options_.max_context) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sequence ", it.sequence, " would hold ", length,
          " tokens, more than this engine's context (", options_.max_context, ")"));
    }
    const std::vector<int64_t> more = *kv_->BlocksNeeded(it.sequence, added);
    for (size_t p = 0; p < more.size(); ++p) needed[p] += more[p];
  }
  if (tokens > options_.max_batch_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("step: ", tokens,
                                                   " tokens, more than max_batch_tokens ",
                                                   options_.max_batch_tokens));
  }
  return kv_->CheckFree(needed, "the step");
}

absl::Status CudaEngine::CheckDraft(const StepItem& item) const {
  if (item.draft_tokens > 0 && config_.sliding_window > 0 &&
      static_cast<int64_t>(item.tokens.size()) > config_.sliding_window - 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("step: sequence ", item.sequence, " brings a drafted chunk of ",
                     item.tokens.size(), " tokens; with a sliding window of ",
                     config_.sliding_window, " it may have at most ", config_.sliding_window - 1));
  }
  return CheckAcceptedDraft(item, drafts_);
}

absl::Status CudaEngine::Reserve(const std::vector<StepItem>& items) {
  for (const StepItem& it : items) {
    // The accepted positions were written by the drafting step: they are
    // reserved already and only become part of the sequence.
    if (!it.accepted_draft.empty()) {
      FLOTILLA_RETURN_IF_ERROR(kv_->Commit(
          it.sequence, static_cast<int64_t>(it.accepted_draft.size()), it.accepted_draft.data()));
    }
    drafts_.erase(it.sequence);
    FLOTILLA_RETURN_IF_ERROR(ReserveKv(it.sequence, static_cast<int64_t>(it.tokens.size())));
  }
  return absl::OkStatus();
}

absl::Status CudaEngine::CommitStep(const std::vector<StepItem>& items) {
  for (const StepItem& it : items) {
    const size_t kept = it.tokens.size() - static_cast<size_t>(it.draft_tokens);
    FLOTILLA_RETURN_IF_ERROR(
        kv_->Commit(it.sequence, static_cast<int64_t>(kept), it.tokens.data()));
    if (it.draft_tokens > 0) drafts_[it.sequence].assign(it.tokens.begin() + kept, it.tokens.end());
  }
  return absl::OkStatus();
}

absl::Status CudaEngine::ReserveKv(int64_t sequence, int64_t tokens) {
  CudaDeviceState& d = *impl_;
  cudaError_t copied = cudaSuccess;
  // Copy on write of a shared block, every layer's K and V (the prefix cache
  // shares only whole blocks, which are never written again, so this is for
  // completeness).
  auto copy = [&](int group, int32_t from, int32_t to) {
    for (const CudaDeviceState::Layer& L : d.layers) {
      if (L.kv_group != group) continue;
      // A block's bytes: bf16 K or V, or an FP8 layer's codes and scales.
      const size_t n = L.kv.fp8() ? static_cast<size_t>(L.kv.fp8_block_bytes)
                                  : static_cast<size_t>(L.kv.kv_heads) * L.kv.block_size *
                                        L.kv.head_dim * sizeof(uint16_t);
      const bool fp8 = L.kv.fp8();
      void* arrays[2] = {fp8 ? static_cast<void*>(L.kv.k8) : L.kv.k,
                         fp8 ? static_cast<void*>(L.kv.v8) : L.kv.v};
      for (void* array : arrays) {
        char* base = static_cast<char*>(array);
        const cudaError_t e =
            cudaMemcpyAsync(base + to * n, base + from * n, n, cudaMemcpyDeviceToDevice, d.stream);
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
  // In steps' chunks, as the sliding-window pool's step reserve assumes.
  for (int64_t done = 0; done < tokens;) {
    const int64_t n = std::min<int64_t>(tokens - done, options_.max_batch_tokens);
    FLOTILLA_RETURN_IF_ERROR(ReserveKv(sequence, n));
    FLOTILLA_RETURN_IF_ERROR(kv_->Commit(sequence, n, nullptr));  // its KV is not its tokens'
    done += n;
  }
  return absl::OkStatus();
}

KvHostTierStats CudaEngine::KvHostStats() const {
  return host_tier_ ? host_tier_->tier().stats() : KvHostTierStats{};
}

std::vector<int64_t> CudaEngine::KvPoolAdmissionBlocks() const {
  std::vector<int64_t> blocks;
  for (int p = 0; p < kv_->num_pools(); ++p) blocks.push_back(kv_->admission_blocks(p));
  return blocks;
}

size_t CudaEngine::kv_pool_block_bytes(int pool) const { return impl_->kv_pool_block_bytes[pool]; }

std::string CudaEngine::KvPoolsSummary() const {
  std::string out;
  for (int p = 0; p < kv_->num_pools(); ++p) {
    absl::StrAppend(&out, p > 0 ? ", " : "", kv_->pool_name(p), " ", kv_->pool_blocks(p),
                    " blocks (", kv_pool_block_bytes(p), " B each)");
  }
  return out;
}

absl::Status CudaEngine::WaitForStep(cudaStream_t stream) {
  const auto start = std::chrono::steady_clock::now();
  absl::Status waited;
  if (options_.parallel == nullptr) {
    waited = CudaStatus(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  } else {
    // A sharded step waits through its context: a peer that died inside an
    // exchange must not hold this thread forever.
    waited = options_.parallel->WaitForStream(stream);
    if (!waited.ok()) {
      AbortExchanges();
      cudaStreamSynchronize(stream);  // the aborted kernels have exited
    }
  }
  last_timing_.wait_us +=
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
  return waited;
}

void CudaEngine::AbortExchanges() {
  // NCCL aborts a communicator only once every graph that captured it is
  // destroyed; an exec destroyed while it runs is freed when it completes,
  // which the abort itself brings about.
  cudaSetDevice(impl_->device);
  impl_->graphs.Clear();
  options_.parallel->Abort();
}

void CudaEngine::SetSkipOps(std::vector<std::string> ops) {
  options_.skip_ops = std::move(ops);
  cudaSetDevice(impl_->device);
  cudaStreamSynchronize(impl_->stream);
  impl_->graphs.Clear();
}

}  // namespace flotilla
