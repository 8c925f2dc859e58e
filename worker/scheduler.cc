#include "worker/scheduler.h"

#include <algorithm>
#include <chrono>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "worker/resume.h"
#include "worker/worker_messages.h"

namespace flotilla::worker {
namespace {

void EndWithError(uint64_t request_id, absl::StatusCode code, const std::string& message,
                  cluster::TokenBatch* out) {
  cluster::SequenceUpdate* u = out->add_updates();
  u->set_request_id(request_id);
  u->set_finish_reason(common::ERROR);
  u->set_error_code(static_cast<int>(code));
  u->set_error(message);
}

SamplingParams SamplingFrom(const common::SamplingParams& p) {
  SamplingParams sp;
  sp.temperature = p.has_temperature() ? p.temperature() : 1.0f;
  sp.top_p = p.has_top_p() ? p.top_p() : 1.0f;
  sp.top_k = p.top_k();
  sp.min_p = p.min_p();
  if (p.has_seed()) sp.seed = p.seed();
  sp.frequency_penalty = p.frequency_penalty();
  sp.presence_penalty = p.presence_penalty();
  sp.repetition_penalty = p.has_repetition_penalty() ? p.repetition_penalty() : 1.0f;
  sp.logit_bias.assign(p.logit_bias().begin(), p.logit_bias().end());
  sp.logprobs = p.return_logprobs() || p.logprobs() > 0;
  sp.top_logprobs = static_cast<int>(p.logprobs());
  sp.min_tokens = p.min_tokens();
  return sp;
}

void AddLogprob(const TokenLogprob& lp, cluster::SequenceUpdate* u) {
  common::TokenLogprob* l = u->add_logprobs();
  l->set_token_id(lp.token);
  l->set_logprob(lp.logprob);
  for (auto& [t, v] : lp.top) {
    common::TopLogprob* top = l->add_top();
    top->set_token_id(t);
    top->set_logprob(v);
  }
}

}  // namespace

Scheduler::Scheduler(const Engine* engine, SchedulerLimits limits, Clock clock,
                     VocabularyProvider vocabulary, DraftMemory* draft_memory)
    : engine_(engine),
      limits_(limits),
      clock_(std::move(clock)),
      vocabulary_(std::move(vocabulary)),
      step_clock_([] {
        return std::chrono::duration_cast<std::chrono::microseconds>(
                   std::chrono::steady_clock::now().time_since_epoch())
            .count();
      }),
      own_draft_memory_(draft_memory == nullptr ? std::make_unique<DraftMemory>() : nullptr),
      draft_memory_(draft_memory == nullptr ? own_draft_memory_.get() : draft_memory) {}

int64_t Scheduler::MaxSequenceLength() const {
  const int64_t engine = engine_->MaxSequenceLength();
  return limits_.max_model_len > 0 ? std::min(engine, limits_.max_model_len) : engine;
}

void Scheduler::Enqueue(cluster::SubmitSequence submit, cluster::TokenBatch* refused) {
  if (static_cast<int64_t>(pending_.size()) >= 4 * limits_.max_sequences) {
    EndWithError(submit.request_id(), absl::StatusCode::kResourceExhausted,
                 "worker queue full; retry later", refused);
    return;
  }
  enqueued_at_[submit.request_id()] = clock_();
  pending_.push_back(std::move(submit));
}

void Scheduler::Cancel(uint64_t request_id) {
  auto it = std::find_if(pending_.begin(), pending_.end(),
                         [&](const auto& s) { return s.request_id() == request_id; });
  if (it != pending_.end()) pending_.erase(it);
  enqueued_at_.erase(request_id);
  auto seq = sequences_.find(request_id);
  if (seq != sequences_.end()) {
    Release(seq->second);
    sequences_.erase(seq);
  }
}

void Scheduler::GrantPromptLogits(uint64_t request_id, uint64_t allowed_bytes) {
  if (auto it = sequences_.find(request_id); it != sequences_.end()) {
    Sequence& seq = it->second;
    if (seq.logits_credit != 0) seq.logits_credit = std::max(seq.logits_credit, allowed_bytes);
    return;
  }
  // A queued request has sent nothing: its credit is its window.
  for (cluster::SubmitSequence& s : pending_) {
    if (s.request_id() != request_id) continue;
    if (s.prompt_logits_credit_bytes() != 0) {
      s.set_prompt_logits_credit_bytes(std::max(s.prompt_logits_credit_bytes(), allowed_bytes));
    }
    return;
  }
}

void Scheduler::FailAll(const absl::Status& why, cluster::TokenBatch* out) const {
  const std::string message(why.message());
  for (const auto& [id, seq] : sequences_) EndWithError(id, why.code(), message, out);
  for (const cluster::SubmitSequence& s : pending_) {
    EndWithError(s.request_id(), why.code(), message, out);
  }
}

int64_t Scheduler::kv_reserved() const {
  int64_t total = 0;
  for (int64_t n : kv_reserved_) total += n;
  return total;
}

void Scheduler::Release(const Sequence& seq) {
  for (size_t p = 0; p < seq.kv_reserved.size(); ++p) kv_reserved_[p] -= seq.kv_reserved[p];
  to_free_.push_back(seq.request_id);
}

void Scheduler::Admit(const cluster::SubmitSequence& s, cluster::TokenBatch* out) {
  const uint64_t now = clock_();
  uint64_t queued_ms = 0;
  if (auto it = enqueued_at_.find(s.request_id()); it != enqueued_at_.end()) {
    queued_ms = now > it->second ? now - it->second : 0;
    enqueued_at_.erase(it);
  }
  auto reject = [&](absl::StatusCode code, const std::string& msg) {
    EndWithError(s.request_id(), code, msg, out);
  };
  const ModelConfig& c = engine_->config();
  const int64_t prompt = s.prompt_ids_size();
  const int64_t max_len = MaxSequenceLength();
  if (prompt == 0) return reject(absl::StatusCode::kInvalidArgument, "the prompt is empty");
  for (int id : s.prompt_ids()) {
    if (id < 0 || id >= c.vocab_size) {
      return reject(absl::StatusCode::kInvalidArgument,
                    absl::StrCat("prompt token id ", id, " is outside [0, ", c.vocab_size, ")"));
    }
  }
  if (prompt >= max_len) {
    return reject(absl::StatusCode::kInvalidArgument,
                  absl::StrCat("prompt of ", prompt, " tokens leaves no room in the context of ",
                               max_len, " tokens"));
  }
  const common::SamplingParams& p = s.sampling();
  SamplingParams sp = SamplingFrom(p);
  std::vector<int> stops;
  if (!p.ignore_eos()) stops = c.eos_token_ids;
  for (int t : p.stop_token_ids()) stops.push_back(t);
  sp.stop_token_ids = stops;
  const int64_t room = max_len - prompt;
  sp.max_tokens = p.max_tokens() == 0 ? room : std::min<int64_t>(p.max_tokens(), room);
  if (absl::Status st = CheckResume(s, stops, sp.max_tokens, c.vocab_size); !st.ok()) {
    return reject(st.code(), std::string(st.message()));
  }
  const std::vector<int32_t> prompt_ids(s.prompt_ids().begin(), s.prompt_ids().end());
  absl::StatusOr<std::unique_ptr<Sampler>> sampler = Sampler::Create(sp, c.vocab_size, prompt_ids);
  if (!sampler.ok()) {
    return reject(sampler.status().code(), std::string(sampler.status().message()));
  }
  Sequence seq;
  seq.request_id = s.request_id();
  seq.prompt = prompt_ids;
  seq.prompt_tokens = prompt;
  seq.sampler = std::move(*sampler);
  seq.max_tokens = sp.max_tokens;
  seq.draws_anywhere = sp.temperature == 0.0f || !sp.seed.has_value();
  absl::StatusOr<SpeculativeConfig> speculative =
      SpeculativeFor(p.speculative(), limits_.speculative);
  if (!speculative.ok()) {
    return reject(speculative.status().code(), std::string(speculative.status().message()));
  }
  SpeculativeConfig drafting = *speculative;
  if (drafting.method == SpeculativeMethod::kEagle3 && draft_memory_->eagle3 == nullptr) {
    return reject(absl::StatusCode::kInvalidArgument,
                  "speculative method \"eagle3\" needs an EAGLE3 draft head on an engine that "
                  "returns hidden states: start the worker, or the coordinator or flotilla up, "
                  "with --speculative-model DIR (or synthetic:eagle3)");
  }
  // An engine that cannot verify runs the request without drafting.
  if (!engine_->VerifiesDrafts()) drafting.method = SpeculativeMethod::kOff;
  seq.stop = StopRules(std::move(stops), sp.max_tokens);
  seq.want_logprobs = sp.logprobs;
  seq.return_prompt_logits = s.return_prompt_logits();
  seq.logits_credit = s.return_prompt_logits() ? s.prompt_logits_credit_bytes() : 0;
  seq.cache_domain = s.cache_domain();
  seq.deadline_unix_ms = s.deadline_unix_ms();
  seq.queued_ms = queued_ms;
  seq.arrived_at = now - queued_ms;
  seq.admitted_at = now;
  if (absl::Status st = Constrain(s, seq); !st.ok()) {
    return reject(st.code(), std::string(st.message()));
  }
  if (absl::Status st = Resume(s, seq); !st.ok()) {
    return reject(st.code(), std::string(st.message()));
  }
  if (drafting.method != SpeculativeMethod::kOff || drafting.allow_replay) {
    seq.drafter = std::make_unique<SpeculativeDrafter>(
        drafting, draft_memory_, absl::MakeConstSpan(prompt_ids), sp, s.request_id(), c.vocab_size);
  }
  // The whole length, cached prefix included: shared blocks are counted once
  // per sequence, so the reservations still bound the blocks in use.
  seq.kv_reserved = engine_->KvPoolBlocksForLength(prompt + sp.max_tokens);
  kv_reserved_.resize(seq.kv_reserved.size(), 0);
  for (size_t p = 0; p < seq.kv_reserved.size(); ++p) kv_reserved_[p] += seq.kv_reserved[p];
  sequences_.emplace(seq.request_id, std::move(seq));
}

absl::Status Scheduler::Constrain(const cluster::SubmitSequence& s, Sequence& seq) {
  if (!s.has_constraint()) return absl::OkStatus();
  if (!vocabulary_) {
    return absl::FailedPreconditionError("this worker does not serve structured outputs");
  }
  absl::StatusOr<std::unique_ptr<ConstraintFilter>> filter =
      ConstraintFilter::Create(s.constraint(), vocabulary_);
  if (!filter.ok()) return filter.status();
  seq.constraint = filter->get();
  seq.sampler->SetFilter(*std::move(filter));
  return absl::OkStatus();
}

absl::Status Scheduler::Resume(const cluster::SubmitSequence& s, Sequence& seq) {
  if (!s.has_resume()) return absl::OkStatus();
  const auto& resumed = s.resume().output_ids();
  const std::vector<int32_t> output(resumed.begin(), resumed.end());
  if (absl::Status st = ReplayOutput(output, *seq.sampler, seq.constraint); !st.ok()) return st;
  seq.prompt.insert(seq.prompt.end(), output.begin(), output.end());
  seq.generated = output;
  return absl::OkStatus();
}

cluster::StepPlan Scheduler::Plan(cluster::TokenBatch* refused) {
  cluster::StepPlan plan;
  for (uint64_t id : to_free_) plan.add_free(id);
  to_free_.clear();
  int64_t budget = limits_.max_batch_tokens;
  const uint64_t now = clock_();
  // Decode tokens first: one per running sequence past its prompt, and the
  // drafts within what the budget has left after them.
  const auto [decoding, longest_draft] = DecodingSequences();
  if (decoding == 0) budget = std::max(budget, limits_.idle_prefill_tokens);
  // Past --speculative-max-batch decoding sequences, drafters draft
  // nothing; below it, the governor says how many tokens a sequence drafts
  // at this batch (0: none). Forced grammar text is drafted either way
  // where the engine verifies on the host.
  const bool allowed =
      limits_.speculative_max_batch == 0 || decoding <= limits_.speculative_max_batch;
  int draft_length = allowed ? longest_draft : 0;
  if (draft_length > 0 && decoding > 0 && limits_.speculative_governor) {
    draft_length = governor_.DraftLength(decoding, draft_length);
  }
  budget -= PlanDecodes(std::max<int64_t>(0, budget - decoding), draft_length, &plan);
  // Admit queued requests while the KV reservation and the sequence cap allow
  // (the policy when KV runs short: queue, never preempt; running sequences
  // always finish, so the queue always drains).
  const std::vector<int64_t> pool_blocks = engine_->KvPoolAdmissionBlocks();
  kv_reserved_.resize(pool_blocks.size(), 0);
  while (!pending_.empty() && static_cast<int64_t>(sequences_.size()) < limits_.max_sequences) {
    const cluster::SubmitSequence& s = pending_.front();
    if (s.deadline_unix_ms() != 0 && now > s.deadline_unix_ms()) {
      EndWithError(s.request_id(), absl::StatusCode::kDeadlineExceeded,
                   "deadline passed while queued", refused);
      enqueued_at_.erase(s.request_id());
      pending_.pop_front();
      continue;
    }
    const int64_t max_len = MaxSequenceLength();
    const std::vector<int64_t> need = engine_->KvPoolBlocksForLength(std::min<int64_t>(
        max_len, s.prompt_ids_size() +
                     (s.sampling().max_tokens() == 0 ? max_len : s.sampling().max_tokens())));
    // Each pool on its own: the request must fit in every one.
    bool too_long = false, wait = false;
    for (size_t p = 0; p < need.size(); ++p) {
      too_long = too_long || need[p] > pool_blocks[p];
      wait = wait || kv_reserved_[p] + need[p] > pool_blocks[p];
    }
    if (too_long) {
      EndWithError(
          s.request_id(), absl::StatusCode::kInvalidArgument,
          absl::StrCat("the request needs ", absl::StrJoin(need, " + "),
                       " KV blocks (per pool) but a worker has ", absl::StrJoin(pool_blocks, " + "),
                       "; lower max_tokens or the prompt"),
          refused);
      enqueued_at_.erase(s.request_id());
      pending_.pop_front();
      continue;
    }
    if (wait) break;  // wait for running sequences to finish
    cluster::SubmitSequence sub = std::move(pending_.front());
    pending_.pop_front();
    Admit(sub, refused);
  }
  PlanPromptChunks(budget, now, &plan);
  FitSampledRows(&plan);
  bool forced = false;
  for (const auto& [id, seq] : sequences_) forced = forced || seq.forced_draft;
  last_plan_ = {decoding, step_clock_(), draft_length, forced};
  return plan;
}

std::pair<int64_t, int> Scheduler::DecodingSequences() const {
  int64_t decoding = 0;
  int longest = 0;
  for (const auto& [id, seq] : sequences_) {
    if (seq.prefilled < static_cast<int64_t>(seq.prompt.size())) continue;
    ++decoding;
    if (seq.drafter != nullptr && seq.drafter->config().method != SpeculativeMethod::kOff) {
      longest = std::max(longest, seq.drafter->config().num_tokens);
    } else if (ForcedDrafts(seq)) {
      longest = std::max(longest, 1);  // forced text: drafting or not
    }
  }
  return {decoding, std::min(longest, kMaxSpeculativeTokens)};
}

int64_t Scheduler::PlanDecodes(int64_t draft_budget, int draft_length, cluster::StepPlan* plan) {
  int64_t planned = 0;
  for (auto& [id, seq] : sequences_) {
    if (seq.prefilled < static_cast<int64_t>(seq.prompt.size())) continue;
    cluster::PlanItem* it = plan->add_items();
    it->set_request_id(id);
    it->mutable_accepted_draft()->Add(seq.accepted_draft.begin(), seq.accepted_draft.end());
    seq.accepted_draft.clear();
    it->add_tokens(seq.generated.back());
    const std::vector<int32_t> draft = DraftOf(seq, draft_budget, draft_length);
    it->mutable_tokens()->Add(draft.begin(), draft.end());
    it->set_draft_tokens(static_cast<uint32_t>(draft.size()));
    it->set_return_hidden(seq.drafter != nullptr && seq.drafter->WantsHidden());
    it->set_logits(cluster::PLAN_LOGITS_LAST);
    draft_budget -= static_cast<int64_t>(draft.size());
    planned += 1 + static_cast<int64_t>(draft.size());
  }
  return planned;
}

std::vector<int32_t> Scheduler::DraftOf(Sequence& seq, int64_t limit, int draft_length) {
  seq.forced_draft = false;
  const bool guessed = draft_length > 0;
  const bool drafter =
      guessed && seq.drafter != nullptr && seq.drafter->config().method != SpeculativeMethod::kOff;
  // Forced grammar text is drafted whatever the bound and the governor say
  // where drafts are verified on the host anyway (the CPU engine). Where the
  // engine draws on a device, a constrained draft is verified on the host
  // (its logit rows copied back and drawn there), which a large batch may
  // not afford: there forced drafts follow the same decision as the others.
  const bool forced = ForcedDrafts(seq) && (guessed || engine_->SamplesOnHost());
  if (!drafter && !forced) return {};
  // Drafted tokens past its last possible one would be wasted (and past its
  // KV reservation).
  const int64_t room = seq.max_tokens - static_cast<int64_t>(seq.generated.size()) - 1;
  limit = std::min(limit, room);
  // A verified chunk stays within what sliding-window layers keep, so that
  // every position it writes is still there when a shorter prefix of it is
  // accepted (CpuEngine::Validate refuses a longer one).
  const int64_t window = engine_->config().sliding_window;
  if (window > 0) limit = std::min<int64_t>(limit, window - 2);
  if (limit <= 0) return {};
  if (forced) {
    std::vector<int32_t> forced_draft =
        seq.constraint->ForcedDraft(std::min<int64_t>(limit, kMaxSpeculativeTokens));
    if (!forced_draft.empty()) {
      seq.forced_draft = true;
      return forced_draft;
    }
  }
  return drafter ? seq.drafter->Propose(seq.generated, std::min<int64_t>(limit, draft_length))
                 : std::vector<int32_t>{};
}

bool Scheduler::ForcedDrafts(const Sequence& seq) const {
  // An engine that draws on a device verifies a constrained draft on the
  // host (VerifiedOnHost): only draws that are the same there keep a
  // seeded request's tokens.
  return limits_.grammar_drafts && seq.constraint != nullptr && engine_->VerifiesDrafts() &&
         (engine_->SamplesOnHost() || seq.draws_anywhere);
}

void Scheduler::FitSampledRows(cluster::StepPlan* plan) {
  const int64_t cap = engine_->MaxDeviceSampledRows();
  if (cap <= 0) return;
  int64_t rows = 0;
  for (const cluster::PlanItem& it : plan->items()) {
    if (it.logits() != cluster::PLAN_LOGITS_NONE) rows += 1 + it.draft_tokens();
  }
  for (int i = plan->items_size() - 1; i >= 0 && rows > cap; --i) {
    cluster::PlanItem* it = plan->mutable_items(i);
    const int64_t cut = std::min<int64_t>(it->draft_tokens(), rows - cap);
    if (cut == 0) continue;
    it->mutable_tokens()->Truncate(it->tokens_size() - static_cast<int>(cut));
    it->set_draft_tokens(it->draft_tokens() - static_cast<uint32_t>(cut));
    rows -= cut;
    if (it->draft_tokens() == 0) sequences_.at(it->request_id()).forced_draft = false;
  }
}

void Scheduler::PlanPromptChunks(int64_t budget, uint64_t now, cluster::StepPlan* plan) {
  if (budget <= 0) return;
  std::vector<Sequence*> prompts;
  std::vector<PrefillCandidate> candidates;
  for (auto& [id, seq] : sequences_) {
    const int64_t size = static_cast<int64_t>(seq.prompt.size());
    if (seq.prefilled >= size) continue;
    const int64_t left = WithinCredit(seq, size - seq.prefilled);
    if (left == 0) continue;  // paused until its client takes what it was sent
    prompts.push_back(&seq);
    candidates.push_back(PrefillCandidate{id, seq.arrived_at, size, left});
  }
  // A prompt's cached prefix is looked up when its first chunk is planned,
  // so the prefix sent with that chunk is what the engine holds.
  auto left_of = [&](size_t i) {
    Sequence& seq = *prompts[i];
    if (!seq.started) TakeCachedPrefix(seq);
    return WithinCredit(seq, static_cast<int64_t>(seq.prompt.size()) - seq.prefilled);
  };
  for (const PrefillChunk& chunk : PlanPrefill(limits_.prefill, candidates, budget, now, left_of)) {
    AddPromptChunk(*prompts[chunk.candidate], chunk.tokens, plan);
  }
}

int64_t Scheduler::WithinCredit(const Sequence& seq, int64_t left) const {
  if (seq.logits_credit == 0) return left;
  if (seq.logits_planned >= seq.logits_credit) return 0;
  const uint64_t row = static_cast<uint64_t>(engine_->config().vocab_size) * sizeof(float);
  const uint64_t rows = (seq.logits_credit - seq.logits_planned + row - 1) / row;
  return static_cast<int64_t>(std::min<uint64_t>(rows, static_cast<uint64_t>(left)));
}

void Scheduler::AddPromptChunk(Sequence& seq, int64_t n, cluster::StepPlan* plan) {
  if (seq.return_prompt_logits) {
    seq.logits_planned += static_cast<uint64_t>(n) *
                          static_cast<uint64_t>(engine_->config().vocab_size) * sizeof(float);
  }
  const int64_t left = static_cast<int64_t>(seq.prompt.size()) - seq.prefilled;
  const bool first = !seq.started;
  cluster::PlanItem* it = plan->add_items();
  it->set_request_id(seq.request_id);
  it->set_first(first);
  if (first) {
    it->mutable_cached_prefix()->Add(seq.prompt.begin(), seq.prompt.begin() + seq.prefilled);
    it->set_cache_domain(seq.cache_domain);
    seq.started = true;
  }
  it->mutable_tokens()->Add(seq.prompt.begin() + seq.prefilled,
                            seq.prompt.begin() + seq.prefilled + n);
  it->set_return_hidden(seq.drafter != nullptr && seq.drafter->WantsHidden());
  it->set_logits(seq.return_prompt_logits ? cluster::PLAN_LOGITS_ALL
                 : n == left              ? cluster::PLAN_LOGITS_LAST
                                          : cluster::PLAN_LOGITS_NONE);
}

void Scheduler::TakeCachedPrefix(Sequence& seq) {
  const int64_t cached =
      seq.return_prompt_logits ? 0 : engine_->CachedPrefixLength(seq.prompt, seq.cache_domain);
  seq.prefilled = cached;
  prefix_queries_ += seq.prompt.size();
  prefix_hits_ += cached;
}

Sampler* Scheduler::SamplerFor(const cluster::PlanItem& item) {
  auto it = sequences_.find(item.request_id());
  if (it == sequences_.end()) return nullptr;
  const Sequence& seq = it->second;
  // Decode tokens and the chunk that completes the prompt draw a token.
  const int64_t prompt = static_cast<int64_t>(seq.prompt.size());
  return seq.prefilled + item.tokens_size() >= prompt ? seq.sampler.get() : nullptr;
}

void Scheduler::Complete(const cluster::StepPlan& plan, const StepOutput& result,
                         cluster::TokenBatch* out) {
  const uint64_t now = clock_();
  const int64_t step_us = step_clock_() - last_plan_.planned_us;
  const uint64_t accepted_before = speculative_.accepted;
  for (int i = 0; i < plan.items_size(); ++i) {
    const cluster::PlanItem& p = plan.items(i);
    auto sit = sequences_.find(p.request_id());
    if (sit == sequences_.end()) continue;  // cancelled during the step
    Sequence& seq = sit->second;
    const bool prefill = seq.prefilled < static_cast<int64_t>(seq.prompt.size());
    PassHidden(seq, p, result, static_cast<size_t>(i));
    if (prefill) {
      seq.prefilled += p.tokens_size();
      // Streamed as they come, in bounded updates (never one huge message).
      if (seq.return_prompt_logits) {
        AppendPromptLogits(seq.request_id, result.logits[i], engine_->config().vocab_size, out);
      }
      if (seq.prefilled < static_cast<int64_t>(seq.prompt.size())) continue;
    }
    if (i >= static_cast<int>(result.sampled.size()) || result.sampled[i].token < 0) continue;
    if (TakeDrawn(seq, p, result, static_cast<size_t>(i), now, out)) sequences_.erase(sit);
  }
  if (limits_.speculative_governor) {
    MeasureStep(plan, step_us, static_cast<int64_t>(speculative_.accepted - accepted_before));
  }
}

void Scheduler::MeasureStep(const cluster::StepPlan& plan, int64_t step_us, int64_t accepted) {
  if (last_plan_.decoding == 0 || plan.items_size() != last_plan_.decoding) return;
  // Forced drafts that bypassed the governor (on an engine that verifies on
  // the host) say nothing about its choice.
  if (last_plan_.forced_drafts && engine_->SamplesOnHost()) return;
  SpeculationGovernor::Sample sample;
  sample.decoding = last_plan_.decoding;
  sample.length = last_plan_.draft_length;
  for (const cluster::PlanItem& item : plan.items()) sample.drafted += item.draft_tokens();
  sample.accepted = accepted;
  sample.micros = static_cast<double>(step_us);
  governor_.Record(sample);
}

void Scheduler::PassHidden(Sequence& seq, const cluster::PlanItem& item, const StepOutput& result,
                           size_t i) {
  if (seq.drafter == nullptr || i >= result.hidden.size() || result.hidden[i].empty()) return;
  const int64_t rows = item.tokens_size();
  const bool prefill = seq.prefilled < static_cast<int64_t>(seq.prompt.size());
  if (prefill) {
    seq.drafter->AddHidden(seq.prefilled, result.hidden[i].data(), rows);
    return;
  }
  // A decode item starts at the last token; its states are valid up to the
  // last accepted drafted token (the rest saw rejected tokens).
  const int64_t first = seq.prompt_tokens + static_cast<int64_t>(seq.generated.size()) - 1;
  const int64_t accepted =
      i < result.accepted.size() ? static_cast<int64_t>(result.accepted[i].size()) : 0;
  seq.drafter->AddHidden(first, result.hidden[i].data(), std::min(rows, 1 + accepted));
}

bool Scheduler::TakeDrawn(Sequence& seq, const cluster::PlanItem& item, const StepOutput& result,
                          size_t i, uint64_t now, cluster::TokenBatch* out) {
  static const std::vector<TokenLogprob> kNone;
  const std::vector<TokenLogprob>& accepted =
      i < result.accepted.size() ? result.accepted[i] : kNone;
  if (item.draft_tokens() > 0) {
    speculative_.drafted += item.draft_tokens();
    speculative_.accepted += accepted.size();
    ++speculative_.verify_steps;
    if (seq.forced_draft) {
      speculative_.grammar_drafted += item.draft_tokens();
      speculative_.grammar_accepted += accepted.size();
      ++speculative_.grammar_verify_steps;
    }
  }
  cluster::SequenceUpdate* u = out->add_updates();
  for (const TokenLogprob& drawn : accepted) {
    if (TakeToken(seq, drawn, now, u)) return true;
  }
  if (TakeToken(seq, result.sampled[i], now, u)) return true;
  for (const TokenLogprob& drawn : accepted) seq.accepted_draft.push_back(drawn.token);
  return false;
}

bool Scheduler::TakeToken(Sequence& seq, const TokenLogprob& drawn, uint64_t now,
                          cluster::SequenceUpdate* u) {
  const int32_t tok = drawn.token;
  u->set_request_id(seq.request_id);
  const StopDecision decision = seq.stop.Check(tok, static_cast<int64_t>(seq.generated.size()));
  const bool stop = decision == StopDecision::kStop;
  if (!seq.got_token) {
    seq.got_token = true;
    seq.first_token_at = now;
  }
  if (!stop) {
    seq.generated.push_back(tok);
    u->add_token_ids(tok);
    if (seq.want_logprobs) AddLogprob(drawn, u);
  }
  u->set_completion_tokens(seq.generated.size() + (stop ? 1 : 0));
  if (decision != StopDecision::kContinue) {
    if (seq.drafter != nullptr) seq.drafter->Finish(seq.generated);
    if (stop) u->set_stop_token(tok);
    u->set_finish_reason(stop ? common::STOP : common::LENGTH);
    u->set_prompt_tokens(seq.prompt_tokens);
    u->set_queue_time_ms(static_cast<uint32_t>(seq.queued_ms));
    u->set_prefill_time_ms(
        static_cast<uint32_t>(seq.first_token_at > seq.admitted_at ? seq.first_token_at - seq.admitted_at : 0));
    u->set_decode_time_ms(static_cast<uint32_t>(now > seq.first_token_at ? now - seq.first_token_at : 0));
  } else if (seq.constraint != nullptr && !seq.constraint->status().ok()) {
    u->set_finish_reason(common::ERROR);
    u->set_error_code(static_cast<int>(seq.constraint->status().code()));
    u->set_error(std::string(seq.constraint->status().message()));
  } else if (seq.deadline_unix_ms != 0 && now > seq.deadline_unix_ms) {
    u->set_finish_reason(common::ERROR);
    u->set_error_code(static_cast<int>(absl::StatusCode::kDeadlineExceeded));
    u->set_error("deadline exceeded");
  } else {
    return false;
  }
  Release(seq);
  return true;
}

}  // namespace flotilla::worker
