// Engine measurements (admin MeasureEngine) on a worker: at once on an
// instance of one rank; in lockstep on a sharded one, where every rank must
// enter the same probe at the same step boundary, since each probe step runs
// the instance's collectives (TP all-reduce, MoE dispatch and combine).
#include <algorithm>

#include "spdlog/spdlog.h"
#include "worker/engine_factory.h"
#include "worker/engine_probe.h"
#include "worker/worker_runtime.h"

namespace flotilla::worker {

void WorkerRuntime::HandleMeasure(const cluster::MeasureEngine& m) {
  if (executor_ && assignment_ && assignment_->world_size() > 1) {
    // Run when every rank has it: StepOnce offers the oldest in the exchange.
    pending_measures_.push_back(m);
    return;
  }
  client_->Send(AnswerMeasurement(m));
}

ProbeLimits WorkerRuntime::LocalProbeLimits() const {
  const Engine& engine = *rank_engine_.engine;
  ProbeLimits limits;
  limits.kv_blocks_available =
      std::min(engine.KvFreeBlocks(), engine.KvTotalBlocks() - scheduler_->kv_reserved());
  // The probe prefills a prompt alone, as an idle instance would serve it.
  limits.max_batch_tokens = StepTokenBudget(*assignment_);
  limits.max_sequences = std::max<uint32_t>(1, assignment_->max_sequences());
  return limits;
}

cluster::WorkerMessage WorkerRuntime::AnswerMeasurement(const cluster::MeasureEngine& m) {
  Engine* engine = rank_engine_.engine.get();
  auto got = [&]() -> absl::StatusOr<cluster::EngineMeasurement> {
    if (!executor_ || !engine) return absl::FailedPreconditionError("the worker is not serving");
    return MeasureEngine(*engine, m.request(), LocalProbeLimits());
  }();
  return MeasurementAnswer(m, std::move(got));
}

cluster::WorkerMessage WorkerRuntime::MeasurementAnswer(
    const cluster::MeasureEngine& m, absl::StatusOr<cluster::EngineMeasurement> got) {
  cluster::WorkerMessage out;
  cluster::EngineMeasurement* r = out.mutable_measurement();
  if (got.ok()) {
    *r = *std::move(got);
  } else {
    r->set_error_code(static_cast<int>(got.status().code()));
    r->set_error(std::string(got.status().message()));
  }
  r->set_measure_id(m.measure_id());
  r->set_worker_id(options_.worker_id);
  r->set_rank(assignment_ ? assignment_->rank() : 0);
  r->set_engine(options_.device);
  r->set_running_sequences(scheduler_ ? static_cast<uint32_t>(scheduler_->running()) : 0);
  if (rank_engine_.engine) kv_free_ = rank_engine_.engine->KvFreeBlocks();
  return out;
}

absl::Status WorkerRuntime::MeasureInLockstep() {
  const cluster::MeasureEngine m = std::move(pending_measures_.front());
  pending_measures_.pop_front();
  Engine& engine = *rank_engine_.engine;
  bool stepped = false;
  ProbeLockstep lockstep;
  lockstep.sample = executor_->leader();
  lockstep.group_logits = executor_->group_logits_agreed();
  lockstep.before_step = [&](int64_t tokens) {
    stepped = true;
    return executor_->AgreeStepTokens(tokens);
  };
  absl::Status lost;  // the ranks are no longer in step
  // Every rank plans the probe with the instance's smallest free KV, so all
  // accept or all refuse it, and the probe fits on every rank.
  const int64_t local_kv = std::max<int64_t>(0, LocalProbeLimits().kv_blocks_available);
  absl::StatusOr<uint64_t> kv = executor_->AgreeMin(static_cast<uint64_t>(local_kv));
  absl::StatusOr<cluster::EngineMeasurement> got = absl::UnknownError("not measured");
  if (!kv.ok()) {
    lost = kv.status();
    got = kv.status();
  } else {
    ProbeLimits limits = LocalProbeLimits();
    limits.kv_blocks_available = static_cast<int64_t>(*kv);
    got = MeasureEngine(engine, m.request(), limits, lockstep);
    // Refusals come before any step, alike on every rank; a failed step may
    // have left peers inside a collective.
    if (!got.ok() && stepped) lost = got.status();
  }
  // The probe's random tokens are no load: keep them out of the expert counts.
  if (lost.ok()) (void)engine.TakeExpertCounts();
  client_->Send(MeasurementAnswer(m, std::move(got)));
  if (!lost.ok()) spdlog::error("engine measurement {} failed mid-probe", m.measure_id());
  return lost;
}

}  // namespace flotilla::worker
