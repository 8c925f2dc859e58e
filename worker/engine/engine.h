// What a worker's step loop needs from an engine, whichever device runs it:
// sequences with a paged KV cache and a step over a batch of them. The CPU
// engine (reference) and the CUDA engine implement it.
#pragma once

#include <cstdint>
#include <unordered_set>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/expert_map.h"
#include "common/model_config.h"
#include "worker/engine/kv_event_log.h"
#include "worker/engine/kv_host_tier.h"
#include "worker/engine/sampler.h"
#include "worker/model/weights.h"

namespace flotilla {

enum class LogitsMode {
  kNone,  // no logits (a prefill chunk that is not the last)
  kLast,  // the chunk's last position
  kAll,   // every position of the chunk
};

struct StepItem {
  int64_t sequence = 0;
  std::vector<int32_t> tokens;  // appended at the sequence's current length
  // Logit rows to return to the caller (a sampler needs none of them: the
  // serving loop asks for kNone, or kAll for prompt logits).
  LogitsMode logits = LogitsMode::kLast;
  // Not null: the engine draws the next token from the chunk's last position
  // on its own device with this request's sampler (its parameters, seed,
  // draw count and penalties) and records the token in it.
  Sampler* sampler = nullptr;
  // Speculative decoding (engines whose VerifiesDrafts() is true; others
  // refuse both). The last `draft_tokens` of `tokens` are drafted: the
  // engine writes their KV but the sequence grows only by the others, and an
  // item with a sampler verifies them (VerifyDraft) from the logits of its
  // last draft_tokens + 1 positions. `accepted_draft`: the first tokens of
  // this sequence's previous draft that verification accepted; they are
  // committed (their KV kept) before `tokens`.
  int32_t draft_tokens = 0;
  std::vector<int32_t> accepted_draft = {};
  // EAGLE3 drafting: return the residual stream after each layer the engine
  // captures (Engine::SetHiddenCapture) at every position of `tokens`
  // (StepOutput::hidden). Refused by an engine that captures none.
  bool return_hidden = false;
  // The chunk's last position gets its logits from the whole tensor-parallel
  // group (engines whose SplitsGroupLogits() is true; others refuse it):
  // each rank runs lm_head over its share of the vocabulary and an
  // all-reduce joins the rows, so the rank that samples reads half (W = 2)
  // of lm_head. A rank with neither a sampler nor `logits` takes part and
  // gets nothing back. Every rank of the group must mark the same items in
  // the same step; a step that marks any item must have every item marked,
  // each without drafts and not kAll, at most kMaxGroupLogitRows of them.
  bool group_logits = false;
};

// Most items of a step with group_logits (the all-reduce moves rows x
// vocab_size floats; more rows cost more than half of lm_head saves).
inline constexpr int kMaxGroupLogitRows = 4;

struct StepOutput {
  // Per item: rows x vocab_size floats (0, 1 or tokens.size() rows).
  std::vector<std::vector<float>> logits;
  // Per item: the token drawn for an item with a sampler (token -1 for the
  // others), its log-probability under the raw logits and, when the sampler
  // asks for top logprobs, the most likely alternatives.
  std::vector<TokenLogprob> sampled;
  // Per item with drafted tokens and a sampler: the drafted tokens accepted,
  // in order, with their logprobs; `sampled` then holds the token drawn
  // after them (the model's own at the first rejected position, or one
  // more after a fully accepted draft). Empty for the other items.
  std::vector<std::vector<TokenLogprob>> accepted;
  // Per item with return_hidden: [tokens][captured layers][hidden_size]
  // floats, the residual stream after each captured layer, in the order
  // SetHiddenCapture named them (empty for the other items).
  std::vector<std::vector<float>> hidden;
  // Per item and token, when the engine was asked to record them (the CPU
  // reference, for tests): the smallest routing margin over the layers,
  // (r_K - r_K+1) / max(1, |r_1|) of the sorted router logits. A margin below
  // the activations' rounding noise means another engine may route that
  // token to a different expert and legitimately disagree from there on.
  std::vector<std::vector<float>> router_margins;
  // Per item, when recorded (CudaEngineOptions::record_routing): the experts
  // each token was sent to, [tokens][layers][K].
  std::vector<std::vector<int32_t>> routing;
  // Per item, after CpuEngine::ForceNextRouting: how much worse the forced
  // experts were by the reference's own router logits, the largest
  // (r_K - r_forced) / max(1, |r_1|) over tokens and layers (0 when the
  // forced experts are the reference's own top K).
  std::vector<float> routing_regret;
};

// The checks every engine makes on one item of a step: the sequence is known
// (`known`) and not already in the step (`seen`, updated), the chunk is not
// empty and every token id is in [0, vocab_size); drafted tokens only when
// the engine `verifies_drafts`, fewer than the chunk's tokens. INVALID_ARGUMENT
// naming the first problem.
absl::Status CheckStepItem(const StepItem& item, bool known, int vocab_size,
                           std::unordered_set<int64_t>* seen, bool verifies_drafts = false);

// The step-wide rules of StepItem::group_logits, for an engine that
// `splits` them (SplitsGroupLogits) or not: none marked, or every item
// marked, none kAll or drafted, at most kMaxGroupLogitRows.
// INVALID_ARGUMENT naming the first problem.
absl::Status CheckGroupLogits(const std::vector<StepItem>& items, bool splits);

class Engine {
 public:
  virtual ~Engine() = default;

  virtual int64_t NewSequence() = 0;
  // INVALID_ARGUMENT for an unknown sequence.
  virtual absl::Status FreeSequence(int64_t sequence) = 0;
  virtual absl::StatusOr<int64_t> SequenceLength(int64_t sequence) const = 0;

  // The checks Step makes before touching anything (INVALID_ARGUMENT for an
  // unknown or repeated sequence, an empty chunk, a token id out of range, a
  // sequence past the context; RESOURCE_EXHAUSTED when KV blocks are short).
  virtual absl::Status Validate(const std::vector<StepItem>& items) const = 0;
  // Runs one forward step; on error no sequence changes. A rank of a
  // sharded instance with no work of its own runs an empty step so that its
  // peers' collectives match (engines built without a ParallelContext refuse
  // an empty step).
  virtual absl::StatusOr<StepOutput> Step(const std::vector<StepItem>& items) = 0;

  // Whether Step takes drafted tokens (StepItem::draft_tokens,
  // accepted_draft) and verifies them. A scheduler does not draft for an
  // engine that does not.
  virtual bool VerifiesDrafts() const { return false; }
  // Whether every token Step draws is the host Sampler's draw (its seed and
  // draw count), with or without drafts. An engine that draws on a device
  // (its own random stream) verifies some drafted items on the host
  // instead (VerifiedOnHost), so a seeded request's tokens there depend on
  // whether it drafted: the scheduler then drafts forced grammar text only
  // for greedy requests.
  virtual bool SamplesOnHost() const { return false; }
  // Whether Step takes StepItem::group_logits (a rank of a tensor-parallel
  // group of two or more on a device that shares lm_head with its peers).
  virtual bool SplitsGroupLogits() const { return false; }
  // Most logit rows one step draws from on the engine's device (an item
  // with a sampler or logits takes 1 + draft_tokens); a step with more is
  // sampled on the host, whose draws are not the device's, so the
  // scheduler trims drafts to fit. 0: no bound.
  virtual int64_t MaxDeviceSampledRows() const { return 0; }

  // EAGLE3 drafting: the layers (0-based) whose output residual stream a
  // step returns for items with return_hidden. INVALID_ARGUMENT naming a
  // layer the model does not have; UNIMPLEMENTED on an engine that cannot.
  virtual absl::Status SetHiddenCapture(std::vector<int> layers) {
    return absl::UnimplementedError("this engine does not return hidden states");
  }

  // Sharded instances: the most tokens any rank of the instance runs in the
  // coming step (every rank passes the same value before every step), so
  // that fixed-capacity exchanges agree on their shapes. Engines that
  // exchange nothing, or size exchanges on the host, ignore it.
  virtual void SetInstanceStepTokens(int64_t max_tokens_any_rank) {}

  // Longest sequence this engine can run (context and KV capacity).
  virtual int64_t MaxSequenceLength() const = 0;
  virtual const ModelConfig& config() const = 0;

  // KV accounting in this engine's blocks: the arena, what is free now, and
  // what one sequence of `tokens` tokens holds at most (every pool together).
  virtual int64_t KvTotalBlocks() const = 0;
  virtual int64_t KvFreeBlocks() const = 0;
  virtual int64_t KvBlocksForLength(int64_t tokens) const = 0;
  // The same per pool of blocks (an engine whose layer groups draw from
  // several pools, each with its own block size, e.g. FP8 full-attention
  // layers beside bf16 sliding-window ones): the blocks admission may
  // reserve in each, and what one sequence of `tokens` tokens holds at most
  // in each. Admission fits a request into every pool. One pool by default.
  virtual std::vector<int64_t> KvPoolAdmissionBlocks() const { return {KvTotalBlocks()}; }
  virtual std::vector<int64_t> KvPoolBlocksForLength(int64_t tokens) const {
    return {KvBlocksForLength(tokens)};
  }

  // The host-memory KV tier under the prefix cache (KvHostTier): its
  // counters, all zero for an engine without one.
  virtual KvHostTierStats KvHostStats() const { return {}; }

  // Prefix caching (an engine without a cache keeps these defaults). How
  // many leading tokens of `prompt` a new sequence of cache domain
  // `cache_domain` can take from the cache instead of computing them: whole
  // KV blocks cached by sequences of the same domain (0: the shared one),
  // always fewer than prompt.size() so that the last prompt token is
  // computed and has logits; 0 when caching is off.
  virtual int64_t CachedPrefixLength(const std::vector<int32_t>& prompt,
                                     uint64_t cache_domain) const {
    return 0;
  }
  // A new sequence of cache domain `cache_domain` that already holds
  // `prefix`, every block of it shared with the cache; the blocks it
  // completes are cached in that domain. FAILED_PRECONDITION unless `prefix`
  // is whole blocks the domain's cache holds (as CachedPrefixLength reported).
  virtual absl::StatusOr<int64_t> NewSequenceWithPrefix(const std::vector<int32_t>& prefix,
                                                        uint64_t cache_domain) {
    if (prefix.empty()) return NewSequence();
    return absl::FailedPreconditionError("this engine has no prefix cache");
  }

  // The prefix cache's report for the coordinator's cache-aware router: the
  // KV blocks it came to hold or stopped holding since the last call, at
  // most `max_keys` keys (KvEventLog: the first call is a resync, and
  // nothing is recorded before it). Engines without a cache report nothing.
  virtual KvEventBatch TakeKvEvents(size_t max_keys) { return {}; }

  // Expert load (the balancer's input): rows this rank's experts ran per
  // (layer, logical expert) since the last call, [layer * E + expert], and
  // the counters restart. Empty when the engine does not count. Cheap: a
  // device engine returns what its last finished read-back brought.
  virtual std::vector<uint64_t> TakeExpertCounts() { return {}; }

  // Where the host spent the last Step's wall time, for engines that measure
  // it (zeros otherwise): until its device work was launched, and waiting for
  // the device (the rest went to the results). worker/step_profile.h.
  // Engines asked to time the device (CudaEngineOptions::time_device_steps)
  // also give, from events on their stream: how long the device sat idle
  // between the previous step's end and this step's first upload, the
  // uploads, and the launched work (the layers, lm_head and sampling).
  struct StepTiming {
    double launch_us = 0, wait_us = 0;
    double device_idle_us = 0, device_upload_us = 0, device_us = 0;
  };
  virtual StepTiming LastStepTiming() const { return {}; }
  // Hot swap: makes the experts of `extra` (its layers' `experts`, other
  // views unused) runnable on this rank in the slots `next` gives them, so
  // that the engine can be switched to `next` (through its parallel
  // context). Experts already held are skipped. Called between steps, while
  // the current map is still in force: a slot the current map uses for
  // another expert is refused (FAILED_PRECONDITION).
  // The device half of a hot swap, ahead of InstallExperts: copies the
  // experts of `extra` into the slots `next` gives them that `current` (the
  // map in force) leaves free. Safe to call from another thread while steps
  // run (ExpertStore's loader); an engine whose experts need no copying
  // keeps this no-op.
  virtual absl::Status StageExperts(const ExpertMap& current, const ExpertMap& next,
                                    const ModelWeights& extra) {
    return absl::OkStatus();
  }
  virtual absl::Status InstallExperts(const ExpertMap& next, ModelWeights extra) {
    return absl::UnimplementedError("this engine cannot load experts while serving");
  }
};

}  // namespace flotilla
