// The ExpertStore's background loads (prepare, commit, abort) on the tiny
// synthetic model, and the CPU engine's expert counts.
#include "worker/expert_store.h"

#include <gtest/gtest.h>

#include <chrono>
#include <numeric>
#include <thread>

#include "tests/engine/small_cpu_engine.h"
#include "worker/engine/cpu_engine.h"

namespace flotilla::worker {
namespace {

constexpr int kExpertWorld = 4;

std::unique_ptr<ModelSource> Tiny() {
  auto source = ModelSource::Open("synthetic:tiny");
  EXPECT_TRUE(source.ok()) << source.status();
  return std::move(*source);
}

ExpertMap Initial(const ModelConfig& c) {
  return *ExpertMap::Contiguous(c.num_hidden_layers, c.num_local_experts, kExpertWorld, 1);
}

// `map` (next version) with a replica of expert `e` on `rank`, slot `slot`, in every layer.
ExpertMap WithReplica(const ExpertMap& map, int e, int rank, int slot) {
  auto locations = map.locations();
  for (auto& layer : locations) layer[e].push_back({rank, slot});
  return *ExpertMap::Create(map.version() + 1, map.world_size(), locations);
}

ExpertStore::Finished WaitFinished(ExpertStore& store) {
  for (int i = 0; i < 1000; ++i) {
    if (auto done = store.TakeFinished()) return *done;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ADD_FAILURE() << "the load never finished";
  return {};
}

TEST(ExpertStore, LoadsWhatTheMapAddsInTheBackgroundAndHandsItOverAtCommit) {
  auto model = Tiny();
  const ExpertMap initial = Initial(model->config());
  std::vector<std::pair<uint64_t, uint64_t>> staged;  // (current, next) versions
  ExpertStore store(model.get(), /*rank=*/0, 0, 1, initial, /*slots=*/3,
                    [&](const ExpertMap& current, const ExpertMap& next, const ModelWeights&) {
                      staged.push_back({current.version(), next.version()});
                      return absl::OkStatus();
                    });
  const ExpertMap next = WithReplica(initial, 5, 0, 2);
  ASSERT_TRUE(store.Prepare(next).ok());
  const ExpertStore::Finished done = WaitFinished(store);
  ASSERT_TRUE(done.status.ok()) << done.status;
  EXPECT_EQ(done.version, 2u);
  EXPECT_GT(done.bytes, 0u);
  EXPECT_EQ(staged, (std::vector<std::pair<uint64_t, uint64_t>>{{1, 2}}));
  absl::StatusOr<ExpertStore::Committed> c = store.Commit(2);
  ASSERT_TRUE(c.ok()) << c.status();
  for (const LayerWeights& layer : c->experts.layers) {
    ASSERT_EQ(layer.experts.size(), 1u);  // only expert 5: 0 and 1 were held
    EXPECT_EQ(layer.experts[0].expert_id, 5);
    EXPECT_NE(layer.experts[0].gate_up.blocks, nullptr);
  }
  // Committed: a map keeping the replica loads nothing more.
  ASSERT_TRUE(store.Prepare(*ExpertMap::Create(3, kExpertWorld, next.locations())).ok());
  EXPECT_EQ(WaitFinished(store).bytes, 0u);
  EXPECT_EQ(staged.back(),
            (std::pair<uint64_t, uint64_t>{2, 3}));  // staged against the committed map
}

TEST(ExpertStore, RefusesSlotsTheRankDoesNotHave) {
  auto model = Tiny();
  const ExpertMap initial = Initial(model->config());
  ExpertStore store(model.get(), 0, 0, 1, initial, /*slots=*/2);
  absl::Status st = store.Prepare(WithReplica(initial, 5, 0, 2));
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("which has 2 slots"), std::string::npos) << st;
}

TEST(ExpertStore, AbortDropsThePreparationAndCommitNeedsOne) {
  auto model = Tiny();
  const ExpertMap initial = Initial(model->config());
  ExpertStore store(model.get(), 0, 0, 1, initial, 3);
  ASSERT_TRUE(store.Prepare(WithReplica(initial, 5, 0, 2)).ok());
  (void)WaitFinished(store);
  store.Abort(2);
  EXPECT_EQ(store.Commit(2).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(ExpertStore, AFailingStageFailsThePreparation) {
  auto model = Tiny();
  const ExpertMap initial = Initial(model->config());
  ExpertStore store(model.get(), 0, 0, 1, initial, 3,
                    [](const ExpertMap&, const ExpertMap&, const ModelWeights&) {
                      return absl::FailedPreconditionError("slot busy");
                    });
  ASSERT_TRUE(store.Prepare(WithReplica(initial, 5, 0, 2)).ok());
  EXPECT_EQ(WaitFinished(store).status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(store.Commit(2).ok());
}

TEST(CpuEngineExpertCounts, EveryTokenCountsTopKRowsPerLayer) {
  const ModelConfig c = ModelConfig::Tiny();
  std::unique_ptr<CpuEngine> engine = testing_util::SmallCpuEngine(c, 64);
  ASSERT_NE(engine, nullptr);
  StepItem item;
  item.sequence = engine->NewSequence();
  item.tokens = {1, 2, 3, 4, 5};
  ASSERT_TRUE(engine->Step({item}).ok());
  const std::vector<uint64_t> counts = engine->TakeExpertCounts();
  ASSERT_EQ(counts.size(), static_cast<size_t>(c.num_hidden_layers * c.num_local_experts));
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const uint64_t rows =
        std::accumulate(counts.begin() + l * c.num_local_experts,
                        counts.begin() + (l + 1) * c.num_local_experts, uint64_t{0});
    EXPECT_EQ(rows, 5u * c.num_experts_per_tok) << "layer " << l;
  }
  const std::vector<uint64_t> again = engine->TakeExpertCounts();
  EXPECT_EQ(std::accumulate(again.begin(), again.end(), uint64_t{0}), 0u);  // restarted
}

}  // namespace
}  // namespace flotilla::worker
