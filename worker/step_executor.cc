#include "worker/step_executor.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "spdlog/spdlog.h"

namespace flotilla::worker {

StepExecutor::StepExecutor(Engine* engine, comm::Communicator* comm,
                           parallel::ParallelContext* context, ParallelConfig parallel, int rank,
                           uint64_t map_version)
    : engine_(engine),
      comm_(comm),
      context_(context),
      parallel_(parallel),
      rank_(rank),
      leader_(parallel.is_leader(rank)),
      map_version_(map_version) {}

void StepExecutor::OfferExpertMap(ExpertMap map) {
  if (map.version() > map_version_) pending_maps_.emplace(map.version(), std::move(map));
}

absl::StatusOr<StepExecutor::Exchanged> StepExecutor::Exchange(const cluster::StepPlan& mine,
                                                               uint64_t measure_id) {
  Exchanged got;
  got.measure_id = measure_id;
  got.any_work = !mine.items().empty() || !mine.free().empty();
  uint64_t have_version = pending_maps_.empty() ? map_version_ : pending_maps_.rbegin()->first;
  const int W = parallel_.world_size();
  if (W > 1) {
    const std::string bytes = leader_ ? mine.SerializeAsString() : std::string();
    // Per rank: its plan's size, the newest expert map it has received, the
    // tokens its plan runs (the engines size their exchanges from the
    // largest), the measurement it waits to run, the prompt-logit rows it
    // computes and whether it offers group logits. Then each leader's plan
    // goes to its TP group only.
    uint64_t plan_tokens = 0, logit_rows = 0;
    for (const cluster::PlanItem& p : mine.items()) {
      plan_tokens += p.tokens_size();
      if (p.logits() == cluster::PLAN_LOGITS_ALL) logit_rows += p.tokens_size();
    }
    constexpr int kHeader = 6;
    std::vector<uint64_t> header(kHeader * W), sizes(W);
    const uint64_t splits = group_logits_offered_ && engine_->SplitsGroupLogits() ? 1 : 0;
    uint64_t mine_header[kHeader] = {bytes.size(), have_version, plan_tokens,
                                     measure_id,   logit_rows,   splits};
    FLOTILLA_RETURN_IF_ERROR(comm_->AllGather(mine_header, header.data(), sizeof(mine_header)));
    uint64_t max_tokens = 0, max_logit_rows = 0;
    group_logits_agreed_ = true;
    for (int r = 0; r < W; ++r) {
      group_logits_agreed_ = group_logits_agreed_ && header[kHeader * r + 5] == 1;
      sizes[r] = header[kHeader * r];
      have_version = std::min(have_version, header[kHeader * r + 1]);
      max_tokens = std::max(max_tokens, header[kHeader * r + 2]);
      // A rank that has not received the measurement yet holds it back.
      if (header[kHeader * r + 3] != measure_id) got.measure_id = 0;
      max_logit_rows = std::max(max_logit_rows, header[kHeader * r + 4]);
    }
    engine_->SetInstanceStepTokens(static_cast<int64_t>(max_tokens));
    // Until the next exchange, peers may be busy with this step's logit rows.
    if (comm_timeout_ > absl::ZeroDuration()) {
      comm_->SetTimeout(
          StepWaitTimeout(comm_timeout_, max_logit_rows, engine_->config().vocab_size));
    }
    const uint64_t max_size = *std::max_element(sizes.begin(), sizes.end());
    got.any_work = max_size > 0;
    if (got.any_work) FLOTILLA_RETURN_IF_ERROR(ReceiveGroupPlan(mine, bytes, sizes, &got.plan));
  } else {
    got.plan = mine;
  }
  SwitchExpertMap(have_version);
  return got;
}

absl::Duration StepWaitTimeout(absl::Duration base, uint64_t logit_rows, int64_t vocab_size) {
  const double bytes = static_cast<double>(logit_rows) * static_cast<double>(vocab_size) * 4.0;
  return base + absl::Seconds(bytes / 1e6);
}

bool GroupLogitsFit(const cluster::StepPlan& plan) {
  if (plan.items().empty() || plan.items_size() > kMaxGroupLogitRows) return false;
  return std::all_of(plan.items().begin(), plan.items().end(), [](const cluster::PlanItem& p) {
    return p.logits() == cluster::PLAN_LOGITS_LAST && p.draft_tokens() == 0;
  });
}

absl::Status StepExecutor::AgreeStepTokens(int64_t tokens) {
  if (parallel_.world_size() == 1) return absl::OkStatus();
  FLOTILLA_ASSIGN_OR_RETURN(std::vector<uint64_t> all, GatherOne(static_cast<uint64_t>(tokens)));
  engine_->SetInstanceStepTokens(static_cast<int64_t>(*std::max_element(all.begin(), all.end())));
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> StepExecutor::AgreeMin(uint64_t value) {
  if (parallel_.world_size() == 1) return value;
  FLOTILLA_ASSIGN_OR_RETURN(std::vector<uint64_t> all, GatherOne(value));
  return *std::min_element(all.begin(), all.end());
}

absl::StatusOr<std::vector<uint64_t>> StepExecutor::GatherOne(uint64_t value) {
  std::vector<uint64_t> all(parallel_.world_size());
  FLOTILLA_RETURN_IF_ERROR(comm_->AllGather(&value, all.data(), sizeof(value)));
  return all;
}

absl::Status StepExecutor::ReceiveGroupPlan(const cluster::StepPlan& mine, const std::string& bytes,
                                            const std::vector<uint64_t>& sizes,
                                            cluster::StepPlan* plan) {
  const int W = parallel_.world_size(), tp = parallel_.tp_size();
  if (leader_) {
    *plan = mine;
    if (tp == 1) return absl::OkStatus();  // every rank leads its own group
  }
  if (tp == 1) return absl::OkStatus();
  // Only inside the TP group: the leader sends its plan to its peers.
  const int lead = parallel_.leader_of_group(parallel_.dp_group_of(rank_));
  std::vector<size_t> send_counts(W, 0), send_offsets(W, 0), recv_counts(W, 0), recv_offsets(W, 0);
  if (leader_) {
    for (int peer = lead + 1; peer < lead + tp; ++peer) send_counts[peer] = bytes.size();
  } else {
    recv_counts[lead] = sizes[lead];
  }
  std::string received(leader_ ? 0 : sizes[lead], '\0');
  FLOTILLA_RETURN_IF_ERROR(comm_->AllToAllV(bytes.data(), send_counts, send_offsets,
                                            received.data(), recv_counts, recv_offsets));
  if (!leader_ && !plan->ParseFromString(received)) {
    return absl::InternalError("could not parse the leader's step plan");
  }
  return absl::OkStatus();
}

void StepExecutor::SwitchExpertMap(uint64_t agreed_version) {
  if (agreed_version <= map_version_ || !pending_maps_.count(agreed_version)) return;
  if (context_) context_->SetExpertMap(pending_maps_.at(agreed_version));
  map_version_ = agreed_version;
  pending_maps_.erase(pending_maps_.begin(), pending_maps_.upper_bound(agreed_version));
  spdlog::info("rank {} switched to expert map version {} at step {}", rank_, map_version_, steps_);
}

absl::StatusOr<std::optional<StepOutput>> StepExecutor::Run(const cluster::StepPlan& plan,
                                                            const SamplerLookup& sampler_for) {
  // The whole plan is checked before anything runs, so a refused plan
  // changes nothing.
  for (const cluster::PlanItem& p : plan.items()) {
    if (!cluster::PlanLogits_IsValid(p.logits())) {
      return absl::InvalidArgumentError(
          absl::StrCat("the step plan asks request ", p.request_id(), " for logits ", p.logits(),
                       ", which this worker does not know (it knows ",
                       cluster::PlanLogits_Name(cluster::PLAN_LOGITS_NONE), ", ",
                       cluster::PlanLogits_Name(cluster::PLAN_LOGITS_LAST), " and ",
                       cluster::PlanLogits_Name(cluster::PLAN_LOGITS_ALL), ")"));
    }
    const bool freed =
        std::find(plan.free().begin(), plan.free().end(), p.request_id()) != plan.free().end();
    if (!p.first() && (freed || !engine_ids_.contains(p.request_id()))) {
      return absl::FailedPreconditionError(
          absl::StrCat("the step plan continues request ", p.request_id(), " on rank ", rank_,
                       ", which never started it (its first chunk did not reach this rank)"));
    }
  }
  for (uint64_t id : plan.free()) {
    auto it = engine_ids_.find(id);
    if (it == engine_ids_.end()) continue;
    FLOTILLA_RETURN_IF_ERROR(engine_->FreeSequence(it->second));
    engine_ids_.erase(it);
  }
  // lm_head split by vocabulary over the TP group where the step allows it:
  // the leader reads its share instead of all of it, and its peers, which
  // would idle, read the rest.
  // (The agreement already holds every rank's engine's SplitsGroupLogits.)
  const bool group_logits = parallel_.tp_size() > 1 && group_logits_agreed_ && GroupLogitsFit(plan);
  if (group_logits && !group_logits_seen_) {
    group_logits_seen_ = true;
    spdlog::info("rank {} runs group logits from step {}: lm_head split over its TP group of {}",
                 rank_, steps_, parallel_.tp_size());
  }
  std::vector<StepItem> items;
  for (const cluster::PlanItem& p : plan.items()) {
    if (p.first()) {
      FLOTILLA_ASSIGN_OR_RETURN(
          engine_ids_[p.request_id()],
          engine_->NewSequenceWithPrefix({p.cached_prefix().begin(), p.cached_prefix().end()},
                                         p.cache_domain()));
    }
    StepItem it;
    it.sequence = engine_ids_.find(p.request_id())->second;  // checked above
    it.tokens.assign(p.tokens().begin(), p.tokens().end());
    it.draft_tokens = static_cast<int32_t>(p.draft_tokens());
    it.accepted_draft.assign(p.accepted_draft().begin(), p.accepted_draft().end());
    // The drafting head runs on the leader: only it needs the hidden states.
    it.return_hidden = leader_ && p.return_hidden();
    // Only the leader samples (on the engine's device): the other ranks of
    // the group skip lm_head. Logit rows come back only as prompt logits.
    it.logits =
        leader_ && p.logits() == cluster::PLAN_LOGITS_ALL ? LogitsMode::kAll : LogitsMode::kNone;
    if (leader_ && p.logits() != cluster::PLAN_LOGITS_NONE && sampler_for) {
      it.sampler = sampler_for(p);
    }
    it.group_logits = group_logits;
    items.push_back(std::move(it));
  }
  if (items.empty() && parallel_.world_size() == 1) return std::optional<StepOutput>();
  FLOTILLA_ASSIGN_OR_RETURN(StepOutput result, engine_->Step(items));
  ++steps_;
  return std::optional<StepOutput>(std::move(result));
}

}  // namespace flotilla::worker
