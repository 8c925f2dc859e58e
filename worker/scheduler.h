// The DP-group leader's scheduling: which requests run, what each step
// computes for them and when they end. Admission (queue bound, deadlines, KV
// reservations, the sequence cap), chunked prefill within the step's token
// budget, the prefix-cache lookup, and the stop and finish rules applied to
// the tokens a step drew. It never touches the engine's state: it reads the
// engine's limits and KV accounting and turns plans and step outputs into
// updates for the coordinator.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "proto/cluster.pb.h"
#include "worker/constraint_filter.h"
#include "worker/engine/engine.h"
#include "worker/engine/sampler.h"
#include "worker/engine/stop_rules.h"
#include "worker/prefill_policy.h"
#include "worker/speculation.h"
#include "worker/speculation_governor.h"
#include "worker/speculative_drafter.h"

namespace flotilla::worker {

struct SchedulerLimits {
  // Tokens one step computes (--max-num-batched-tokens; decode tokens may
  // overrun it): one decode token per sequence past its prompt, then prompt
  // chunks in what is left, split by `prefill`.
  int64_t max_batch_tokens = 1;
  // A step with no decode token (no running sequence is past its prompt)
  // may compute this many prompt tokens when that is more than
  // max_batch_tokens (--idle-prefill-tokens; 0 = off): an idle instance
  // prefills a long prompt in fewer, larger steps, which cost less per
  // token, while running streams never wait behind such a step.
  int64_t idle_prefill_tokens = 0;
  int64_t max_sequences = 1;     // running sequences
  int64_t max_model_len = 0;     // longest sequence; 0 = the engine's limit
  PrefillPolicy prefill;         // which prompts get chunks, and how large
  // Speculative decoding for requests that do not choose (--speculative-method,
  // --num-speculative-tokens). Drafted tokens count in max_batch_tokens;
  // engines that do not verify drafts run every request without.
  SpeculativeConfig speculative;
  // A step with more decoding sequences than this drafts nothing
  // (--speculative-max-batch; 0 = no bound): verifying k tokens per sequence
  // multiplies a large batch's work, which then costs more than the
  // accepted tokens save (worker/README.md "Speculative decoding").
  int64_t speculative_max_batch = 0;
  // Below that bound, whether a step drafts is measured per batch size
  // (SpeculationGovernor, --speculative-governor); off: every step drafts.
  bool speculative_governor = false;
  // Grammar-forced drafts (--grammar-drafts): a structured-output request
  // whose grammar admits one continuation drafts its tokens
  // (ConstraintFilter::ForcedDraft) instead of its drafter's, whatever
  // speculative_max_batch and the governor say (worker/README.md
  // "Speculative decoding").
  bool grammar_drafts = true;
};

// Speculative decoding, since the scheduler started: tokens drafted, drafted
// tokens accepted, verification steps (steps of a sequence with a draft).
// The grammar_ counts are the part of each that grammar-forced drafts make.
struct SpeculativeCounts {
  uint64_t drafted = 0, accepted = 0, verify_steps = 0;
  uint64_t grammar_drafted = 0, grammar_accepted = 0, grammar_verify_steps = 0;
};

class Scheduler {
 public:
  // Milliseconds since the Unix epoch (deadlines are wall-clock times).
  using Clock = std::function<uint64_t()>;
  // Microseconds of a monotonic clock: how long steps take (the speculation
  // governor's measurements).
  using StepClock = std::function<int64_t()>;

  // `engine` must outlive the scheduler; the scheduler only reads it.
  // `vocabulary` builds structured-output constraints (requests with one are
  // refused without it). `draft_memory`: what drafters remember across
  // requests (the worker's, so it outlives a rebuilt scheduler; must outlive
  // this one); null: the scheduler keeps its own.
  Scheduler(const Engine* engine, SchedulerLimits limits, Clock clock,
            VocabularyProvider vocabulary = nullptr, DraftMemory* draft_memory = nullptr);

  // Queues a request; when the queue is full (4 x max_sequences) refuses it
  // with RESOURCE_EXHAUSTED in `refused` instead. A request with `resume`
  // continues a migrated one: its updates start with the first new token
  // and count its earlier output as generated.
  void Enqueue(cluster::SubmitSequence submit, cluster::TokenBatch* refused);
  // Forgets a queued or running request; a running one is freed on every
  // rank by the next plan.
  void Cancel(uint64_t request_id);
  // Raises the prompt-logits credit of a queued or running request to
  // `allowed_bytes` sent in all (PromptLogitsCredit); a lower value changes
  // nothing. A sequence whose next prompt row would pass its credit is not
  // planned (it pauses, its KV kept) until the credit grows.
  void GrantPromptLogits(uint64_t request_id, uint64_t allowed_bytes);
  // Ends every request held (running or queued) with `why`, into `out`.
  void FailAll(const absl::Status& why, cluster::TokenBatch* out) const;

  // The next step: frees, decode tokens first, then the admitted requests'
  // prompt chunks within the token budget, by the limits' PrefillPolicy. Requests refused at admission
  // (deadline passed, too long, bad sampling) are ended into `refused`.
  cluster::StepPlan Plan(cluster::TokenBatch* refused);
  // The sampler that draws the item's next token on the engine's device, or
  // null for a prompt chunk that does not end the prompt.
  Sampler* SamplerFor(const cluster::PlanItem& item);
  // Takes the step's output for `plan` (item by item): prompt progress and
  // prompt logits, drawn tokens with their logprobs, and the finish of
  // sequences at a stop token, their length limit or their deadline.
  void Complete(const cluster::StepPlan& plan, const StepOutput& result, cluster::TokenBatch* out);

  size_t running() const { return sequences_.size(); }
  size_t queued() const { return pending_.size(); }
  // KV blocks reserved by the running sequences (their whole length), every
  // pool together.
  int64_t kv_reserved() const;
  // Prompt tokens looked up in the prefix cache and found there.
  uint64_t prefix_queries_tokens() const { return prefix_queries_; }
  uint64_t prefix_hits_tokens() const { return prefix_hits_; }
  const SpeculativeCounts& speculative_counts() const { return speculative_; }
  const SpeculationGovernor& speculation_governor() const { return governor_; }
  // Replaces the steady clock that times steps (tests).
  void set_step_clock(StepClock clock) { step_clock_ = std::move(clock); }
  // Longest sequence served: the engine's limit within max_model_len.
  int64_t MaxSequenceLength() const;

 private:
  struct Sequence {
    uint64_t request_id = 0;
    // What is prefilled: the prompt, then a resumed request's earlier output.
    std::vector<int32_t> prompt;
    int64_t prompt_tokens = 0;  // the request's own prompt (reported)
    int64_t prefilled = 0;
    bool started = false;  // its first chunk was planned
    std::vector<int32_t> generated;  // a resumed request's earlier output first
    std::unique_ptr<Sampler> sampler;
    StopRules stop{{}, 0};
    bool want_logprobs = false;
    bool return_prompt_logits = false;
    // Prompt-logits bytes it may send in all (0 = no limit), and those of
    // the rows planned so far.
    uint64_t logits_credit = 0;
    uint64_t logits_planned = 0;
    uint64_t cache_domain = 0;  // its prefix-cache domain (SubmitSequence)
    std::vector<int64_t> kv_reserved;  // per KV pool (Engine::KvPoolBlocksForLength)
    uint64_t deadline_unix_ms = 0;
    const ConstraintFilter* constraint = nullptr;  // owned by the sampler
    // Whether its draws are the same wherever they are made (greedy or
    // unseeded): forced drafts on an engine that samples on a device.
    bool draws_anywhere = false;
    bool forced_draft = false;  // its last planned draft is grammar-forced
    int64_t max_tokens = 0;     // output tokens it may have in all
    // Its drafter (null when it neither drafts nor records for replay).
    std::unique_ptr<SpeculativeDrafter> drafter;
    // The drafted tokens its last step's verification accepted: its next
    // plan item has every rank commit them (their KV is written).
    std::vector<int32_t> accepted_draft;
    // Timings reported with the last token (clock_ milliseconds).
    uint64_t queued_ms = 0;    // waiting before admission
    uint64_t arrived_at = 0;   // queued (the prefill policy's arrival order)
    uint64_t admitted_at = 0;
    uint64_t first_token_at = 0;
    bool got_token = false;
  };

  void Admit(const cluster::SubmitSequence& s, cluster::TokenBatch* out);
  // Puts the request's structured-output constraint on its sampler.
  absl::Status Constrain(const cluster::SubmitSequence& s, Sequence& seq);
  // A migrated request (SubmitSequence.resume): its earlier output replayed
  // through the sampler and constraint, then prefilled after the prompt and
  // counted as generated (worker/resume.h).
  absl::Status Resume(const cluster::SubmitSequence& s, Sequence& seq);
  // Starts the prompt after its longest cached prefix (none when the request
  // wants every prompt position's logits) and counts the lookup.
  void TakeCachedPrefix(Sequence& seq);
  void PlanPromptChunks(int64_t budget, uint64_t now, cluster::StepPlan* plan);
  // The prompt tokens `seq` may be given now, up to `left`: all of them
  // unless its prompt logits are under credit; then the rows its credit
  // allows (the last may pass it by less than a row), 0 while paused.
  int64_t WithinCredit(const Sequence& seq, int64_t left) const;
  // Adds `seq`'s next `tokens` prompt tokens to `plan`.
  void AddPromptChunk(Sequence& seq, int64_t tokens, cluster::StepPlan* plan);
  // The sequences past their prompt, and the most tokens one of them would
  // draft this step: its drafter's num_tokens, or 1 for a sequence whose
  // only drafts are forced grammar text (so the governor weighs drafting at
  // all); 0 when none.
  std::pair<int64_t, int> DecodingSequences() const;
  // One decode item per sequence past its prompt: its last token, what its
  // last verification accepted, and a draft within `draft_budget` tokens
  // (taken from it): forced grammar text, or at most `draft_length` of its
  // drafter's (0: none). The decode tokens planned.
  int64_t PlanDecodes(int64_t draft_budget, int draft_length, cluster::StepPlan* plan);
  // The draft `seq` brings this step: at most `limit` tokens, fewer than
  // it may still generate; the grammar's forced continuation when it has
  // one (seq.forced_draft), else up to `draft_length` of its drafter's.
  std::vector<int32_t> DraftOf(Sequence& seq, int64_t limit, int draft_length);
  // Whether `seq` may draft the text its grammar forces.
  bool ForcedDrafts(const Sequence& seq) const;
  // Trims the drafts of `plan` (from its last item back) until its sampled
  // rows fit Engine::MaxDeviceSampledRows, so that a step is never moved to
  // host sampling (other draws) by its drafts.
  void FitSampledRows(cluster::StepPlan* plan);
  // EAGLE3: the target's hidden states the step returned for `item` (its
  // i-th) to the sequence's drafter, the rows computed from real tokens.
  void PassHidden(Sequence& seq, const cluster::PlanItem& item, const StepOutput& result, size_t i);
  // Takes the tokens a step drew for a decoding sequence (its accepted
  // drafted tokens, then the token drawn after them) into one update;
  // true when the sequence ended.
  bool TakeDrawn(Sequence& seq, const cluster::PlanItem& item, const StepOutput& result, size_t i,
                 uint64_t now, cluster::TokenBatch* out);
  // Takes the token drawn for `seq` into `u`; true when the sequence ended.
  bool TakeToken(Sequence& seq, const TokenLogprob& drawn, uint64_t now,
                 cluster::SequenceUpdate* u);
  void Release(const Sequence& seq);
  // Gives the governor the step just completed (`plan`, `step_us` after it
  // was planned, `accepted` drafted tokens) when it was decode-only.
  void MeasureStep(const cluster::StepPlan& plan, int64_t step_us, int64_t accepted);

  const Engine* engine_;
  const SchedulerLimits limits_;
  const Clock clock_;
  const VocabularyProvider vocabulary_;
  std::deque<cluster::SubmitSequence> pending_;
  std::map<uint64_t, uint64_t> enqueued_at_;  // pending request id -> clock_() when queued
  std::map<uint64_t, Sequence> sequences_;  // running, by request id
  std::vector<uint64_t> to_free_;
  std::vector<int64_t> kv_reserved_;  // per KV pool, sized at the first admission
  uint64_t prefix_queries_ = 0, prefix_hits_ = 0;
  SpeculativeCounts speculative_;
  SpeculationGovernor governor_;
  StepClock step_clock_;
  // The last plan, as the governor measures it: its decoding sequences
  // (decode-only when it holds as many items), when it was handed out, the
  // draft length it was planned with, and whether some item's draft is
  // grammar-forced.
  struct PlannedStep {
    int64_t decoding = 0, planned_us = 0;
    int draft_length = 0;
    bool forced_drafts = false;
  } last_plan_;
  std::unique_ptr<DraftMemory> own_draft_memory_;  // when none was given
  DraftMemory* draft_memory_;
};

}  // namespace flotilla::worker
