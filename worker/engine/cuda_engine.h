// The gpt-oss forward pass on one CUDA GPU: every op of MODEL.md runs on the
// device (kernels/cuda), weights and the paged KV arena are allocated once,
// and decode steps are captured as CUDA graphs per (batch bucket, context
// bucket) and replayed. Same step API as CpuEngine (the reference), plus a
// step that samples on the GPU.
//
// Layout on the device: the residual stream in f32, activations fed to
// matmuls in bf16, q/k/v projections fused into one [(NH + 2 NKV) D, H]
// matrix, experts in their packed MXFP4 checkpoint layout, KV cache bf16
// [num_blocks, kv_heads, block_size, D] per layer. The KV blocks are a
// KvBlockAllocator's (the CPU engine's rules) with two layer groups, each
// with its own pool of blocks: the full-attention layers keep every
// position, the sliding-window layers only the window (and a step's new
// positions), so a block holds block_size positions of every layer of one
// group and a long sequence takes about half the memory it would if every
// layer kept every position.
//
// Sharded (CudaEngineOptions::parallel set, W > 1 ranks): the engine holds its
// TP rank's q and kv heads (and their KV), the experts its rank holds in the
// expert map (by slot), and the replicated embedding, norms, router and
// lm_head. Each layer runs its heads' attention, sums the O projection over
// the TP group (tp().AllReduce), routes, dispatches its share of the tokens to
// the experts' ranks (ep().Dispatch), runs its own experts on the rows it
// received and joins the outputs (ep().Combine). Every operation is ordered on
// the engine's stream, so decode steps stay one CUDA graph.
//
// Its parts: StepLayout (the host plan of a step), LayerStages (a step's
// launches stage by stage), DeviceSampler, GraphCache, DeviceArena and the
// device state they share (cuda_engine_state.h); worker/README.md lists
// the files.
// Not thread-safe: one owner drives it.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/model_config.h"
#include "common/model_spec.h"
#include "kernels/cuda/moe.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/sampling.h"
#include "worker/engine/engine.h"
#include "worker/engine/engine_sequences.h"
#include "worker/engine/kv_block_allocator.h"
#include "worker/engine/kv_cache_dtype.h"
#include "worker/model/weights.h"

namespace flotilla {

class CudaWeightFeed;  // worker/engine/cuda_weight_feed.h
struct StepLayout;     // worker/engine/step_layout.h
struct CudaDeviceState;  // worker/engine/cuda_engine_state.h
class CudaKvHostTier;    // worker/engine/cuda_kv_host_tier.h
class LayerStages;       // worker/engine/cuda_layer_stages.h
class DeviceSampler;     // worker/engine/device_sampler.h
struct DeviceSampling;   // worker/engine/device_sampler.h

namespace parallel {
class ParallelContext;  // worker/parallel/parallel_context.h
}

struct CudaEngineOptions {
  int device = 0;
  // A sharded rank's view of the instance (Memory::kDevice on `device`; must
  // outlive the engine), or nullptr: this engine holds the whole model.
  parallel::ParallelContext* parallel = nullptr;
  int kv_block_size = 16;
  // Blocks in each KV pool (one pool per layer group; each pool's block 0
  // is kept as scratch for padded graph rows); 0: what this engine's share
  // of the device (gpu_memory_utilization of its memory) leaves after its
  // weights, workspaces and a reserve for the CUDA context, capped by the
  // memory free now, split between the pools (the sliding-window pool sized
  // for max_sequences sequences, at most half the bytes; the rest to the
  // full-attention pool). Ranks sharing one GPU each take their own fraction.
  int64_t kv_num_blocks = 0;
  // kFp8: the full-attention layers' K and V as e4m3 codes with a bf16 scale
  // per (position, kv head) (kernels/cuda/ops.h PagedKvLayer); sliding-window
  // layers stay bf16. A full-attention block then takes (head_dim + 2) /
  // (2 head_dim) of a bf16 one, so its pool holds ~1.94x the blocks in the
  // same bytes; attention reads half the bytes of a full-attention layer.
  KvCacheDtype kv_cache_dtype = KvCacheDtype::kBf16;
  // Deterministic numerics (`--deterministic`): the same step on the same
  // state gives the same bits every time. The MoE sums each token's expert
  // outputs in choice order (kernels/cuda/moe.h) and accumulating
  // projections do not split their input over blocks that meet in float
  // atomics (kernels/cuda/ops.h). Costs measured in kernels/moe_notes.md.
  // One GPU; a sharded engine's exchanges keep their own order.
  bool deterministic = false;
  // With prefix_cache: bytes of pinned host memory keeping the cached KV
  // blocks the pools evict (the host tier, kv_host_tier.h), copied back
  // with cudaMemcpyAsync on a later hit; 0 = none.
  int64_t kv_host_cache_bytes = 0;
  double gpu_memory_utilization = 0.90;
  // Longest sequence served (0: max_position_embeddings); sizes block tables.
  int64_t max_context = 0;
  // Sharded: expert slots per layer beyond those the expert map uses at
  // start, for replicas loaded while serving (InstallExperts).
  int spare_expert_slots = 0;
  int max_batch_tokens = 8192;  // tokens in one step
  int max_sequences = 256;      // sequences in one step
  // Share the KV blocks of identical prompt prefixes (worker/engine/prefix_cache.h).
  bool prefix_cache = true;
  bool cuda_graphs = true;      // capture decode steps
  // Steps of at most this many tokens (capped at 8, kernels::cuda::
  // kNormQkvRopeMaxTokens) run the input norm, QKV projection, RoPE and KV
  // write as one launch; larger ones as three. 0 turns the fused launch off.
  // 120b decode on an H200 (ms per step, fused / three launches): batch 1
  // 3.10 / 3.26, batch 2 3.93 / 4.09, batch 4 5.53 / 5.60, batch 8 8.56 / 8.43
  // (every block of the fused launch reads all tokens' residual rows, which
  // costs more than the launches it saves at 8 tokens). The same launch fed
  // by a separate norm launch measured as the three launches (3.26 at batch 1):
  // the gain is the launch saved, not the work. Measured again once the
  // kernels around it had changed (H200, three alternated runs, fused up to
  // 4 / up to 2 tokens): batch 2 3.430-3.440 / 3.432-3.444 ms, batch 3 (run
  // as 4 tokens) 4.931-4.943 / 4.853-4.859, batch 4 4.947-4.963 / 4.857-4.868:
  // at 3-4 tokens the three launches now win.
  int fused_qkv_max_tokens = 2;
  // Steps of at most this many tokens (capped at kernels::cuda::
  // kNormLinearMaxTokens) run the post-attention norm inside the router
  // projection (one launch fewer per layer); 0 keeps them apart.
  int fused_router_norm_max_tokens = 8;
  // With the fused router on one GPU: its last block also groups the chosen
  // experts' pairs and its blocks convert x for the MoE (kernels::cuda::
  // MoeRouteTargets), so the MoE layer skips its routing launch.
  bool route_in_router = true;
  // Steps of at most this many tokens run the fused router as one cluster of
  // CTAs that hold its weights in shared memory (kernels::cuda::
  // LaunchRouterCluster) where the device allows it; above, or 0, the
  // grid-wide kernel with its atomics and last-block ranking.
  int router_cluster_max_tokens = 8;
  // Prefill attention over a bf16 cache on warpgroup MMA (wgmma); false keeps
  // it on mma.sync (kernels::cuda::LaunchAttention's prefill_wgmma).
  bool attention_prefill_wgmma = true;
  // Steps of at most this many tokens ask L2 for the O projection's weights
  // (23.6 MB a layer at 120b) on a stream beside the step while attention
  // runs; 0 turns it off. 120b decode on an H200, ms per step, off / on:
  // batch 1 3.031 / 2.961, 2 3.745 / 3.679, 4 5.387 / 5.314, 8 8.307 /
  // 8.331 (three runs each). The next layer's QKV weights asked for during
  // the MoE gained nothing (that kernel already asks L2 for its tile before
  // it waits; asked for during the router they do gain, below), nor did the
  // down weights asked for by the gate_up tiles (batch 1: 3.15 against 3.04
  // ms).
  int l2_prefetch_max_tokens = 4;
  // Steps of at most this many tokens (and within l2_prefetch_max_tokens)
  // also ask L2 for the next layer's QKV weights on that stream as soon as
  // the O projection ends, while the router (which reads little) runs; that
  // layer's fused norm + QKV kernel then skips its own blocks' prefetch.
  // 0 leaves it to those blocks as they start. H200, 120b, ms per step, 0 /
  // 2: batch 1 2.674-2.700 / 2.646-2.649, batch 2 3.407-3.431 / 3.313-3.315
  // (at batch 4 the QKV launch is not fused; asked for there too: 5.08
  // against 4.85).
  int l2_prefetch_next_qkv_max_tokens = 2;
  // Tensor parallel over CUDA IPC: steps of at most this many tokens (capped
  // at kernels::cuda::kLinearTpSumMaxTokens) sum the O projection over the
  // TP group in the projection's launch (kernels::cuda::LaunchLinearTpSum:
  // each block sends its rows to the peers as flagged lines as soon as it
  // has them) instead of a separate all-reduce launch; the same bits. 0
  // keeps them apart.
  int tp_sum_in_projection_max_tokens = 8;
  // How this engine's MoE layers and fused norm + QKV launches run: the
  // defaults are the fastest measured; the worker's --moe-gemm-min-pairs and
  // the benchmarks change them. Each engine keeps its own (nothing
  // process-wide), so engines of one process may differ.
  kernels::cuda::MoeTuning moe_tuning;
  kernels::cuda::NormQkvRopeTuning qkv_tuning;
  // Tests: fill StepOutput::routing with every token's experts per layer.
  bool record_routing = false;
  // Benchmarks: time every op with events (no graphs); see op_time_ms().
  bool profile_ops = false;
  // Benchmarks: events around each step's uploads and launched work, read
  // into LastStepTiming's device fields (the step then waits for them).
  bool time_device_steps = false;
  // Benchmarks (ablation): ops named here (the labels of op_time_ms(), e.g.
  // "rmsnorm", "rope_kv_write", "router_linear") are left out of every step,
  // so the time an op costs inside a graph replay can be measured as the
  // difference. The outputs of such steps are meaningless.
  std::vector<std::string> skip_ops;
};

struct SampledToken {
  int32_t token = -1;
  float logprob = 0.0f;  // log-softmax of the raw logits at `token`
};

class CudaEngine : public Engine {
 public:
  // Uploads `weights`: every head and expert, or with options.parallel the
  // shard LoadShard gives for this rank (its TP rank's heads, its experts).
  static absl::StatusOr<std::unique_ptr<CudaEngine>> Create(const ModelWeights& weights,
                                                            const CudaEngineOptions& options);
  // Generates on the device exactly the weights `flotilla make-checkpoint`
  // writes for (config, weights), in the layout Create uploads them to: the same
  // engine as Create(LoadWeights(that checkpoint)), with no checkpoint and no
  // host copy (a staging buffer of one layer on the device while it builds).
  // With options.parallel, only this rank's shard of it.
  static absl::StatusOr<std::unique_ptr<CudaEngine>> CreateFromSyntheticCheckpoint(
      const ModelConfig& config, const SyntheticWeights& weights, const CudaEngineOptions& options);
  // Fills every weight on the device from `seed` with the benchmarks' own
  // generator (not the checkpoint's values; no checkpoint, no host copy):
  // 120b-shaped benchmarks.
  static absl::StatusOr<std::unique_ptr<CudaEngine>> CreateSynthetic(
      const ModelConfig& config, uint64_t seed, const CudaEngineOptions& options);
  ~CudaEngine();
  CudaEngine(const CudaEngine&) = delete;
  CudaEngine& operator=(const CudaEngine&) = delete;

  int64_t NewSequence() override;
  absl::Status FreeSequence(int64_t sequence) override {
    return FreeKnownSequence(*kv_, drafts_, sequence);
  }
  absl::StatusOr<int64_t> SequenceLength(int64_t sequence) const override {
    return KnownSequenceLength(*kv_, sequence);
  }
  // Whole cached blocks whose full layers' KV and sliding layers' window are
  // still in the arena (KvBlockAllocator::MatchPrefix).
  int64_t CachedPrefixLength(const std::vector<int32_t>& prompt,
                             uint64_t cache_domain) const override;
  absl::StatusOr<int64_t> NewSequenceWithPrefix(const std::vector<int32_t>& prefix,
                                                uint64_t cache_domain) override;
  KvEventBatch TakeKvEvents(size_t max_keys) override { return kv_->TakeEvents(max_keys); }

  // As CpuEngine::Validate / Step; also INVALID_ARGUMENT for a step over
  // max_batch_tokens tokens or max_sequences sequences.
  absl::Status Validate(const std::vector<StepItem>& items) const override;
  absl::StatusOr<StepOutput> Step(const std::vector<StepItem>& items) override;
  // Drafted tokens (speculative decoding) as on the CPU engine: their KV is
  // written but uncommitted until the sequence's next step names the
  // accepted ones (the rest is overwritten later). The item's last
  // draft_tokens + 1 positions get logit rows and each row's draw is the one
  // a step without speculation makes there (VerifyDraft): on the device when
  // every such item's draws do not depend on the tokens before them (no
  // penalty, logit_bias, pending min_tokens or structured output) and the
  // rows fit the sampling buffers (max_sequences), else on the host. A step
  // whose items all bring the same number of drafted tokens replays a CUDA
  // graph (StepLayout pads it); other steps with drafts run eagerly.
  bool VerifiesDrafts() const override { return true; }
  // With a ParallelContext whose TP group has two or more ranks: each runs
  // lm_head over its share of the vocabulary (LayerStages::GroupLogits).
  bool SplitsGroupLogits() const override;
  // The sampling buffers' rows: min(max_sequences, logit rows).
  int64_t MaxDeviceSampledRows() const override;
  // EAGLE3: a step with return_hidden items copies x after each of `layers`
  // to pinned host memory (C x max_batch_tokens x hidden floats, allocated
  // here) and runs eagerly, outside the graph cache.
  absl::Status SetHiddenCapture(std::vector<int> layers) override;
  void SetInstanceStepTokens(int64_t max_tokens_any_rank) override {
    instance_step_tokens_ = max_tokens_any_rank;
  }
  // Sharded ranks count the rows each expert slot runs on the device; each
  // call queues the counters' read-back (and reset) on the engine's stream
  // after the step and returns the previous read-back once it has landed
  // (no host wait). Empty on a single-GPU engine (nothing to balance).
  std::vector<uint64_t> TakeExpertCounts() override;
  StepTiming LastStepTiming() const override { return last_timing_; }
  // Uploads the experts `next` places in slots the current map leaves free
  // (options.spare_expert_slots of them beyond the map's) from host memory:
  // StageExperts on its own stream from the caller's thread while steps go
  // on; InstallExperts (between steps) only when they were not staged.
  absl::Status StageExperts(const ExpertMap& current, const ExpertMap& next,
                            const ModelWeights& extra) override;
  absl::Status InstallExperts(const ExpertMap& next, ModelWeights extra) override;

  // Runs a step and samples one token per item on the GPU from the logits of
  // the item's last position (`params` one per item). A step whose items
  // each bring one token (decode) replays a captured CUDA graph.
  absl::StatusOr<std::vector<SampledToken>> StepAndSample(
      const std::vector<StepItem>& items, const std::vector<kernels::cuda::SamplingRow>& params);

  // Benchmarks: makes `sequence` `tokens` longer without running the model
  // (its new KV positions hold whatever the arena holds: pseudo-random values
  // written at creation).
  absl::Status ExtendSynthetic(int64_t sequence, int64_t tokens);

  int64_t MaxSequenceLength() const override;
  // Blocks of every pool together (see kv_pools() for each one's).
  int64_t num_kv_blocks() const { return kv_->num_blocks(); }
  // Cached blocks no sequence holds count as free (they are evictable).
  int64_t free_kv_blocks() const { return kv_->free_blocks(); }
  // The KV pools (one per layer group) and what a block of each takes on
  // the device, for logs and benches.
  const KvBlockAllocator& kv_pools() const { return *kv_; }
  size_t kv_pool_block_bytes(int pool) const;
  // "full-attention 120016 blocks (8448 B/layer), sliding-window ..."
  std::string KvPoolsSummary() const;
  const ModelConfig& config() const override { return config_; }
  int64_t KvTotalBlocks() const override { return num_kv_blocks(); }
  int64_t KvFreeBlocks() const override { return free_kv_blocks(); }
  int64_t KvBlocksForLength(int64_t tokens) const override {
    return kv_->BlocksForLength(tokens);
  }
  std::vector<int64_t> KvPoolAdmissionBlocks() const override;
  KvHostTierStats KvHostStats() const override;
  std::vector<int64_t> KvPoolBlocksForLength(int64_t tokens) const override {
    return kv_->PoolBlocksForLength(tokens);
  }
  // Blocks of `group` (0: full-attention layers, 1: sliding-window layers
  // when the model has both) a sequence holds now (tests).
  int64_t KvBlocksHeld(int64_t sequence, int group) const { return kv_->BlocksHeld(sequence, group); }
  // Bytes of weights on the device, and the bytes one decode token of a
  // single sequence reads (bf16 matrices, lm_head, top-k experts per layer).
  size_t weight_bytes() const { return weight_bytes_; }
  size_t decode_bytes_per_token() const;
  // With profile_ops: milliseconds spent per op kind since the last reset.
  const std::map<std::string, double>& op_time_ms() const { return op_time_ms_; }
  // Steps whose sampling ran on the host, wholly (prompt logits asked for
  // beside a draw, adjustments or masks past the device buffers, a masked
  // row that wants logprobs or its logits) or for the items whose drafted
  // chunk depends on the tokens before it (VerifiedOnHost).
  int64_t host_sampled_steps() const { return host_sampled_steps_; }
  // CUDA graphs captured so far (decode and verify steps, one per shape).
  size_t captured_graphs() const;
  void reset_op_times() { op_time_ms_.clear(); }
  // Benchmarks: replaces CudaEngineOptions::skip_ops (drops captured graphs).
  void SetSkipOps(std::vector<std::string> ops);

 private:
  explicit CudaEngine(std::unique_ptr<CudaDeviceState> impl, const ModelConfig& config);

  // Weights from `feed`, or (no feed) the benchmarks' fill from `seed`.
  static absl::StatusOr<std::unique_ptr<CudaEngine>> Build(const ModelConfig& config,
                                                           std::unique_ptr<CudaWeightFeed> feed,
                                                           uint64_t seed,
                                                           const CudaEngineOptions& options);
  // Commits each item's accepted drafted tokens, then reserves its chunk.
  absl::Status Reserve(const std::vector<StepItem>& items);
  // Commits each item's tokens but its drafted ones, which are remembered.
  absl::Status CommitStep(const std::vector<StepItem>& items);
  // An item's accepted_draft is a prefix of its sequence's last draft; a
  // drafted chunk stays within what the sliding-window layers keep.
  absl::Status CheckDraft(const StepItem& item) const;
  absl::Status ReserveKv(int64_t sequence, int64_t tokens);
  // Items with a sampler through logits copied to the host and the CPU
  // sampler (prompt logits asked for in the same step, or too many adjustments).
  absl::StatusOr<StepOutput> StepWithHostSampling(const std::vector<StepItem>& items);
  // One step (cuda_engine_step.cc): validated, its KV reserved, laid out,
  // launched; the logit rows into `logits_out` or, with `sampling`, the
  // draws into `logits_out->sampled` or `sampled`.
  absl::Status RunStep(const std::vector<StepItem>& items, const DeviceSampling* sampling,
                       StepOutput* logits_out, std::vector<SampledToken>* sampled);
  // The step's StepLayout into the pinned metadata and up to the device,
  // with the sampling rows; `step_bound`: a sharded step's token bound.
  absl::StatusOr<StepLayout> LayOutStep(const std::vector<StepItem>& items,
                                        const DeviceSampling* sampling, bool logits_out,
                                        int64_t* step_bound);
  // The step's launches: a decode step's graph (captured on first use) or
  // the stages launched eagerly.
  absl::Status LaunchStep(LayerStages& stages, const StepLayout& plan,
                          const DeviceSampling* sampling, int64_t step_bound);
  // record_routing: every item's tokens' experts per layer (waits).
  absl::StatusOr<std::vector<std::vector<int32_t>>> CollectRouting(
      const std::vector<StepItem>& items);
  // The logit rows of a step without sampling, in pieces when they exceed
  // the device buffer (waits).
  absl::Status CollectLogits(const std::vector<StepItem>& items, const StepLayout& plan,
                             LayerStages& stages, std::vector<std::vector<int32_t>> routing,
                             StepOutput* out);
  // SetHiddenCapture: each return_hidden item's rows of hidden_host into
  // out->hidden (after the step's wait).
  void CollectHidden(const std::vector<StepItem>& items, StepOutput* out) const;
  absl::Status UploadExperts(const ExpertMap& current, const ExpertMap& next,
                             const ModelWeights& extra, cudaStream_t stream);
  // time_device_steps: the step's events into last_timing_ (after the wait).
  absl::Status ReadStepEvents();
  // Waits for the step's work on `stream`: through the parallel context
  // when sharded (interruptible, and it reports the exchanges' health).
  // The time waited adds to last_timing_.wait_us.
  absl::Status WaitForStep(cudaStream_t stream);
  // Sharded: destroys the captured graphs and aborts the context's exchanges.
  void AbortExchanges();

  std::unique_ptr<CudaDeviceState> impl_;
  ModelConfig config_;
  CudaEngineOptions options_;
  int64_t max_blocks_per_seq_ = 0;
  size_t weight_bytes_ = 0;
  // The arena's blocks but 0 (scratch), by layer group; sequences are its ids.
  std::unique_ptr<CudaKvHostTier> host_tier_;  // before kv_, which points at it
  std::unique_ptr<KvBlockAllocator> kv_;
  std::map<std::string, double> op_time_ms_;
  int64_t instance_step_tokens_ = 0;  // SetInstanceStepTokens; 0: this rank's own
  int64_t host_sampled_steps_ = 0;
  StepTiming last_timing_;                  // LastStepTiming
  std::unique_ptr<DeviceSampler> sampler_;  // the draws of Step's samplers and StepAndSample
  // Per sequence: the tokens its last step drafted (KV written past its
  // length), until its next step.
  std::unordered_map<int64_t, std::vector<int32_t>> drafts_;
};

}  // namespace flotilla
