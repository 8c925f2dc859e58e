// One lockstep step of a rank: the exchange of the DP-group leaders' plans
// over the instance, the switch to a new expert map and the start of an
// engine measurement at a step boundary that every rank agrees on, and the
// engine step running this rank's group plan.
// Every rank of the instance calls Exchange once per iteration, in the same
// order, whether or not it has work (the MoE collectives must match).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "comm/communicator.h"
#include "common/expert_map.h"
#include "common/parallel_config.h"
#include "proto/cluster.pb.h"
#include "worker/engine/engine.h"
#include "worker/parallel/parallel_context.h"

namespace flotilla::worker {

// How long the ranks of a step wait for each other when the step makes
// `logit_rows` prompt-logit rows of `vocab_size` floats somewhere: `base`,
// plus those bytes at a floor of 1 MB/s (computing, serializing and sending
// them to the coordinator on a loaded CPU machine is far faster).
absl::Duration StepWaitTimeout(absl::Duration base, uint64_t logit_rows, int64_t vocab_size);

// Whether a TP group's step of `plan` takes its logits from the whole group
// (StepItem::group_logits): every item asks for its last position's logits
// (PLAN_LOGITS_LAST) without drafted tokens, at most kMaxGroupLogitRows of
// them. Every rank of the group decides from the same plan alone, so all
// agree; the engines must split (Engine::SplitsGroupLogits).
bool GroupLogitsFit(const cluster::StepPlan& plan);

class StepExecutor {
 public:
  // `comm`: the instance's host communicator, null for an instance of one
  // rank. `context`: the engine's parallel context (expert-map switches go to
  // it), null when the engine exchanges nothing. `map_version`: the version
  // of the expert map the engine starts with. All must outlive the executor.
  StepExecutor(Engine* engine, comm::Communicator* comm, parallel::ParallelContext* context,
               ParallelConfig parallel, int rank, uint64_t map_version);

  // A newer expert map received from the coordinator; it is used from the
  // first step boundary where every rank has it. Older ones are ignored.
  void OfferExpertMap(ExpertMap map);

  // The communicator's configured wait for a silent peer. From then on each
  // Exchange sets the waits until the next one to this plus an allowance for
  // the prompt-logit rows any leader computes and sends in the step
  // (StepWaitTimeout): a long legitimate step is not a dead peer.
  void SetCommTimeout(absl::Duration base) { comm_timeout_ = base; }

  // Whether this rank offers group logits (on by default): steps that fit
  // (GroupLogitsFit) take them while every rank of the instance offers them
  // and has an engine that splits (agreed in each Exchange).
  void SetGroupLogits(bool on) { group_logits_offered_ = on; }

  struct Exchanged {
    cluster::StepPlan plan;  // this rank's group plan
    bool any_work = false;   // some group of the instance has work
    // Every rank offered this engine measurement: all run it after this
    // step (0: none agreed).
    uint64_t measure_id = 0;
  };
  // Shares `mine` (the leader's plan; empty on other ranks) with the whole
  // instance, returns this rank's group plan, tells the engine the largest
  // step of any rank and switches the expert map when all ranks have a newer
  // one. `measure_id`: the oldest engine measurement this rank was asked for
  // and has not run (0: none); it comes back in `measure_id` once every rank
  // offers the same one.
  absl::StatusOr<Exchanged> Exchange(const cluster::StepPlan& mine, uint64_t measure_id = 0);

  // For engine steps outside the plans (the engine probe), called by every
  // rank before the same step with its tokens: tells the engine the largest,
  // as Exchange does before a planned step.
  absl::Status AgreeStepTokens(int64_t tokens);
  // The smallest `value` any rank passes (every rank calls it at the same point).
  absl::StatusOr<uint64_t> AgreeMin(uint64_t value);

  // The sampler that draws a plan item's token (leader only); may return null.
  using SamplerLookup = std::function<Sampler*(const cluster::PlanItem&)>;
  // Frees, creates and steps the plan's sequences. Only the leader samples
  // and asks for logit rows (`sampler_for` is not called elsewhere). Nothing
  // (no output) when a one-rank instance had only frees to do.
  absl::StatusOr<std::optional<StepOutput>> Run(const cluster::StepPlan& plan,
                                                const SamplerLookup& sampler_for);

  bool leader() const { return leader_; }
  // Whether every rank offered group logits in the last Exchange (and has an
  // engine that splits): the same answer on every rank.
  bool group_logits_agreed() const { return group_logits_agreed_; }
  uint64_t steps() const { return steps_; }
  uint64_t map_version() const { return map_version_; }
  // Whether a newer expert map waits for every rank to have it.
  bool map_pending() const { return !pending_maps_.empty(); }

 private:
  // The plan this rank runs: its own (a leader) or its group leader's, sent
  // inside the TP group only; `sizes` are every rank's plan bytes.
  absl::Status ReceiveGroupPlan(const cluster::StepPlan& mine, const std::string& bytes,
                                const std::vector<uint64_t>& sizes, cluster::StepPlan* plan);
  void SwitchExpertMap(uint64_t agreed_version);
  // Every rank's `value`, by rank.
  absl::StatusOr<std::vector<uint64_t>> GatherOne(uint64_t value);

  Engine* engine_;
  comm::Communicator* comm_;
  absl::Duration comm_timeout_ = absl::ZeroDuration();  // zero: left as configured
  parallel::ParallelContext* context_;
  const ParallelConfig parallel_;
  const int rank_;
  const bool leader_;
  bool group_logits_offered_ = true;
  bool group_logits_agreed_ = false;  // by every rank in the last Exchange
  bool group_logits_seen_ = false;    // logged once
  uint64_t steps_ = 0;
  // Expert maps received but not yet in use, by version.
  std::map<uint64_t, ExpertMap> pending_maps_;
  uint64_t map_version_ = 0;
  // Request id -> engine sequence id (every rank of the group).
  std::map<uint64_t, int64_t> engine_ids_;
};

}  // namespace flotilla::worker
