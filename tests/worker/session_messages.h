// The coordinator's messages a worker test pushes and what it reads back from
// the worker's sent messages, shared by the runtime tests over fakes
// (worker_runtime_fake_test.cc, worker_pair_test.cc), with the engine factory
// that builds a FakeEngine per rank.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "common/expert_map_proto.h"
#include "common/model_config.h"
#include "proto/cluster.pb.h"
#include "tests/worker/fake_engine.h"
#include "worker/engine_factory.h"

namespace flotilla::worker {

// Builds a FakeEngine for each StartComm (or fails as scripted), and keeps
// the tokens of every item its engines stepped, which outlive the engines.
class FakeEngineFactory final : public EngineFactory {
 public:
  bool WantsHostWeights(const ModelSource&) const override { return false; }
  absl::StatusOr<RankEngine> Create(EngineSpec spec) override {
    if (!create_error.ok()) return create_error;
    auto engine = std::make_unique<FakeEngine>(spec.weights.config);
    engine->step_error = step_error;
    engine->on_step = [this](const std::vector<StepItem>& items) {
      std::vector<std::vector<int32_t>> tokens;
      for (const StepItem& item : items) tokens.push_back(item.tokens);
      std::lock_guard<std::mutex> lock(mu_);
      step_tokens_.push_back(std::move(tokens));
    };
    last = engine.get();
    RankEngine built;
    built.engine = std::move(engine);
    return built;
  }
  // Each step's items' tokens, over every engine built.
  std::vector<std::vector<std::vector<int32_t>>> step_tokens() const {
    std::lock_guard<std::mutex> lock(mu_);
    return step_tokens_;
  }

  absl::Status create_error, step_error;
  FakeEngine* last = nullptr;

 private:
  mutable std::mutex mu_;
  std::vector<std::vector<std::vector<int32_t>>> step_tokens_;
};

// Rank `rank` of an instance of `world` ranks in one TP group (tp = world) of
// the tiny synthetic model, over UCX as the coordinator assigns it.
inline cluster::CoordinatorMessage Assignment(uint64_t generation, int world = 1, int rank = 0) {
  const ModelConfig c = ModelConfig::Tiny();
  cluster::CoordinatorMessage m;
  cluster::Assignment* a = m.mutable_assignment();
  a->set_generation(generation);
  a->set_model_path("synthetic:tiny:3");
  a->set_world_size(world);
  a->set_rank(rank);
  a->set_tp_size(world);
  a->set_tp_rank(rank);
  a->mutable_comm()->set_backend(cluster::COMM_BACKEND_UCX);
  *a->mutable_expert_map() =
      ExpertMapToProto(*ExpertMap::Contiguous(c.num_hidden_layers, c.num_local_experts, world));
  a->set_max_batch_tokens(4);
  a->set_max_sequences(2);
  return m;
}

inline cluster::CoordinatorMessage StartComm(uint64_t generation) {
  cluster::CoordinatorMessage m;
  m.mutable_start_comm()->set_generation(generation);
  return m;
}

inline cluster::CoordinatorMessage Submit(uint64_t id, int prompt_tokens, uint32_t max_tokens,
                                          std::vector<int32_t> stop = {}) {
  cluster::CoordinatorMessage m;
  cluster::SubmitSequence* s = m.mutable_submit();
  s->set_request_id(id);
  for (int i = 0; i < prompt_tokens; ++i) s->add_prompt_ids(100 + i);
  s->mutable_sampling()->set_max_tokens(max_tokens);
  for (int32_t t : stop) s->mutable_sampling()->add_stop_token_ids(t);
  return m;
}

inline cluster::CoordinatorMessage DropGeneration(uint64_t generation, const std::string& reason) {
  cluster::CoordinatorMessage m;
  m.mutable_drop_generation()->set_generation(generation);
  m.mutable_drop_generation()->set_reason(reason);
  return m;
}

// The updates for `request_id` among the messages sent.
inline std::vector<cluster::SequenceUpdate> UpdatesFor(
    const std::vector<cluster::WorkerMessage>& sent, uint64_t request_id) {
  std::vector<cluster::SequenceUpdate> updates;
  for (const cluster::WorkerMessage& m : sent) {
    for (const cluster::SequenceUpdate& u : m.tokens().updates()) {
      if (u.request_id() == request_id) updates.push_back(u);
    }
  }
  return updates;
}

inline bool Finished(const std::vector<cluster::WorkerMessage>& sent, uint64_t request_id) {
  for (const cluster::SequenceUpdate& u : UpdatesFor(sent, request_id)) {
    if (u.finish_reason() != common::FINISH_REASON_UNSPECIFIED) return true;
  }
  return false;
}

template <typename Pred>
bool Any(const std::vector<cluster::WorkerMessage>& sent, Pred pred) {
  return std::any_of(sent.begin(), sent.end(), pred);
}

}  // namespace flotilla::worker
