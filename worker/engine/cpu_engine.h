// The gpt-oss forward pass on the CPU (the reference engine): every layer of
// MODEL.md in f32, a paged KV cache, and a step API over a batch of sequences.
// Each sequence in a step contributes a chunk of prompt tokens or one decode
// token; the step returns logits for the positions asked for.
#pragma once

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cpu/thread_pool.h"
#include "worker/engine/engine.h"
#include "worker/engine/engine_sequences.h"
#include "worker/engine/kv_cache.h"
#include "worker/engine/kv_cache_dtype.h"
#include "worker/engine/moe_activation.h"
#include "worker/model/weights.h"
#include "worker/parallel/parallel_context.h"

namespace flotilla {

struct CpuEngineOptions {
  int64_t kv_block_size = 16;
  // Blocks in the KV arena; see CpuEngine::KvBlocksFor to size it for a
  // number of concurrent sequences of a given length.
  int64_t kv_num_blocks = 0;
  // Fill StepOutput::router_margins (tests comparing other engines).
  bool record_router_margins = false;
  // Fill StepOutput::routing with the experts each token went to (tests:
  // another engine follows them through ForceNextRouting).
  bool record_routing = false;
  // Share the KV blocks of identical prompt prefixes (KvCacheOptions::prefix_cache).
  bool prefix_cache = true;
  // kFp8: full-attention layers keep K and V as the FP8 cache would give them
  // back (rounded through e4m3 and its scale when written; kv_cache_dtype.h).
  KvCacheDtype kv_cache_dtype = KvCacheDtype::kBf16;
  // With prefix_cache: bytes of host memory keeping the cached KV blocks the
  // arena evicts (KvCacheOptions::host_cache_bytes; 0 = none).
  int64_t kv_host_cache_bytes = 0;
  // kFp8: the experts' inputs go through MXFP8 blocks first (moe_activation.h).
  MoeActivation moe_activation = MoeActivation::kDefault;
};

class CpuEngine : public Engine {
 public:
  // `pool` (may be nullptr: single-threaded) and `context` (a host context;
  // nullptr when this rank holds all heads and experts) must outlive the
  // engine. With a context, `weights` hold this rank's heads and the experts
  // the context's expert map places on this rank (the tensor-parallel MoE
  // layout: every expert, whole; the engine keeps this TP rank's slices).
  static absl::StatusOr<std::unique_ptr<CpuEngine>> Create(
      ModelWeights weights, const CpuEngineOptions& options, kernels::cpu::ThreadPool* pool,
      parallel::ParallelContext* context = nullptr);

  // KV blocks needed for `sequences` sequences of up to `tokens` tokens each.
  static int64_t KvBlocksFor(const ModelConfig& config, int64_t kv_heads, int64_t block_size,
                             int64_t sequences, int64_t tokens, bool prefix_cache = true);

  int64_t NewSequence() override;
  absl::StatusOr<int64_t> ForkSequence(int64_t sequence);
  absl::Status FreeSequence(int64_t sequence) override {
    return FreeKnownSequence(*kv_, drafts_, sequence);
  }
  absl::StatusOr<int64_t> SequenceLength(int64_t sequence) const override {
    return KnownSequenceLength(*kv_, sequence);
  }
  int64_t CachedPrefixLength(const std::vector<int32_t>& prompt,
                             uint64_t cache_domain) const override;
  absl::StatusOr<int64_t> NewSequenceWithPrefix(const std::vector<int32_t>& prefix,
                                                uint64_t cache_domain) override;
  KvEventBatch TakeKvEvents(size_t max_keys) override { return kv_->TakeEvents(max_keys); }

  // Runs one forward step. INVALID_ARGUMENT for an unknown or repeated
  // sequence, an empty chunk, a token id outside [0, vocab_size), or a
  // sequence that would exceed the context (max_position_embeddings or what
  // the KV cache can ever hold); RESOURCE_EXHAUSTED when the KV blocks are
  // momentarily taken by other sequences. On error no sequence changes.
  absl::StatusOr<StepOutput> Step(const std::vector<StepItem>& items) override;

  // The checks Step makes before touching anything (all but the momentary
  // KV-block shortage). A distributed leader runs them before broadcasting a
  // step so that no rank of the instance fails a step its peers run.
  absl::Status Validate(const std::vector<StepItem>& items) const override;

  // Drafted tokens are verified on the host with the item's sampler
  // (VerifyDraft); their KV stays written but uncommitted until the next
  // step of the sequence names the accepted ones, and the rest is
  // overwritten.
  bool VerifiesDrafts() const override { return true; }
  bool SamplesOnHost() const override { return true; }

  // EAGLE3: x_ after each of `layers` is copied out for items with
  // return_hidden (StepOutput::hidden). Every rank of a TP group holds the
  // whole residual stream, so any rank can return it.
  absl::Status SetHiddenCapture(std::vector<int> layers) override;

  // Tests: the next Step sends each token to the given experts instead of its
  // own top K (per item, [tokens][layers][K], as StepOutput::routing), with
  // the softmax over its own router logits of those experts, and reports in
  // StepOutput::routing_regret how far they were from its own choice. Lets a
  // reference follow another engine through routing decisions that bf16
  // noise can swing.
  void ForceNextRouting(std::vector<std::vector<int32_t>> routing) {
    forced_routing_ = std::move(routing);
  }

  // Longest sequence this engine can run (context and KV capacity).
  int64_t MaxSequenceLength() const override;
  const ModelConfig& config() const override { return weights_.config; }
  int64_t KvTotalBlocks() const override { return kv_->num_blocks(); }
  int64_t KvFreeBlocks() const override { return kv_->free_blocks(); }
  int64_t KvBlocksForLength(int64_t tokens) const override { return kv_->BlocksForLength(tokens); }
  KvHostTierStats KvHostStats() const override { return kv_->host_tier_stats(); }
  const KvCache& kv_cache() const { return *kv_; }
  std::vector<uint64_t> TakeExpertCounts() override;
  absl::Status InstallExperts(const ExpertMap& next, ModelWeights extra) override;

 private:
  CpuEngine(ModelWeights weights, std::unique_ptr<KvCache> kv, kernels::cpu::ThreadPool* pool,
            parallel::ParallelContext* context);

  // ForceNextRouting's entries checked against the step (one per item,
  // [tokens][layers][K], ids in range) and each token's item noted.
  absl::Status PrepareForcedRouting(const std::vector<StepItem>& items,
                                    const std::vector<int64_t>& offsets);
  // Commits each item's accepted drafted tokens, then reserves its chunk.
  absl::Status ReserveStep(const std::vector<StepItem>& items);
  // Commits each item's tokens but its drafted ones, which are remembered.
  absl::Status CommitStep(const std::vector<StepItem>& items);
  // The final norm and lm_head on the rows asked for (and those samplers
  // draw from: the last position, or the draft_tokens + 1 verified ones);
  // the draws and logit rows into `out`.
  void FinalRows(const std::vector<StepItem>& items, const std::vector<int64_t>& offsets,
                 StepOutput* out);
  // One layer in three stages: attention (with the TP sum of o_proj), the
  // router, the MoE; the residual stream x_ in place.
  // SetHiddenCapture: after `layer`, its x_ rows into each return_hidden
  // item's entry of `hidden` (sized on the first captured layer).
  void CaptureHidden(int layer, const std::vector<StepItem>& items,
                     const std::vector<int64_t>& offsets,
                     std::vector<std::vector<float>>* hidden) const;
  absl::Status RunLayer(int layer, const std::vector<StepItem>& items,
                        const std::vector<int64_t>& offsets, int64_t tokens);
  absl::Status RunAttention(int layer, const std::vector<StepItem>& items,
                            const std::vector<int64_t>& offsets, int64_t tokens);
  // Top-k experts and weights per token into topk_idx_ / topk_w_.
  void RunRouter(int layer, const std::vector<int64_t>& offsets, int64_t tokens);
  // ForceNextRouting: the given experts replace the ranked ones (weights
  // from their router logits) and each item's regret is recorded.
  void ForceRouting(int layer, const std::vector<int64_t>& offsets, int64_t tokens);
  // record_margins: each token's smallest routing margin so far.
  void RecordMargins(int64_t tokens);
  // The experts (one rank, dispatched, or the TP layout's slices) added
  // into x_.
  absl::Status RunMoe(int layer, int64_t tokens);
  // One rank: every expert on this rank's tokens, summed into y_.
  void RunExperts(int layer, int64_t tokens);
  // Several ranks: the MoE block through the context (dispatch, the experts
  // held here on the rows received, combine into y_).
  absl::Status RunDispatchedExperts(int layer, int64_t tokens);
  // Runs each received row through the expert of its slot; writes `rows.out`.
  absl::Status RunHeldExperts(int layer, const parallel::ExpertRows& rows);
  // Runs expert `x` on the `n` rows of ex_in_; the result lands in ex_out_.
  void RunExpert(const ExpertWeights& x, int64_t n);

  ModelWeights weights_;
  std::unique_ptr<KvCache> kv_;
  kernels::cpu::ThreadPool* pool_;
  parallel::ParallelContext* context_;
  // Rows run per (layer, expert) since TakeExpertCounts; [layer * E + e].
  std::vector<uint64_t> expert_counts_;
  // Owners of the views InstallExperts added.
  std::vector<std::shared_ptr<const void>> installed_;
  // Per sequence: the tokens its last step drafted (KV written past its
  // length), until its next step.
  std::unordered_map<int64_t, std::vector<int32_t>> drafts_;
  std::vector<int> capture_layers_;  // SetHiddenCapture's
  std::vector<float> inv_freq_;
  float rope_scaling_;

  // Step workspaces, grown as needed and reused.
  std::vector<int64_t> positions_;
  std::vector<float> x_, t_, q_, k_, v_, attn_, o_, router_, y_;
  std::vector<int32_t> topk_idx_;
  std::vector<float> topk_w_;
  bool record_margins_ = false;
  bool record_routing_ = false;
  KvCacheDtype kv_cache_dtype_ = KvCacheDtype::kBf16;
  MoeActivation moe_activation_ = MoeActivation::kDefault;
  std::vector<float> margins_;  // per token of the step
  std::vector<int32_t> routing_;  // record_routing: [tokens][layers][K] of the step
  std::vector<std::vector<int32_t>> forced_routing_;
  std::vector<int64_t> token_item_;  // per token of the step: its item
  std::vector<float> regret_;        // per item
  std::vector<float> ex_in_, ex_gu_, ex_act_, ex_out_;
};

}  // namespace flotilla
