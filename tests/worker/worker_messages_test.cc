#include "worker/worker_messages.h"

#include <gtest/gtest.h>

#include <numeric>

#include "absl/status/status.h"

namespace flotilla::worker {
namespace {

std::vector<float> Rows(int64_t rows, int64_t vocab) {
  std::vector<float> v(rows * vocab);
  std::iota(v.begin(), v.end(), 0.0f);
  return v;
}

TEST(PromptLogits, GoOutAsBoundedUpdatesOfWholeRowsInOrder) {
  const int64_t vocab = 201088;  // o200k_harmony: a row is 786 KiB
  const std::vector<float> logits = Rows(5, vocab);
  cluster::TokenBatch batch;
  AppendPromptLogits(42, logits, vocab, &batch);
  ASSERT_EQ(batch.updates_size(), 3);  // 2 + 2 + 1 rows
  std::vector<float> joined;
  for (const auto& u : batch.updates()) {
    EXPECT_EQ(u.request_id(), 42u);
    EXPECT_EQ(u.prompt_logits_size() % vocab, 0);
    EXPECT_LE(u.prompt_logits_size() * sizeof(float), kPromptLogitsChunkBytes);
    EXPECT_EQ(u.finish_reason(), common::FINISH_REASON_UNSPECIFIED);
    joined.insert(joined.end(), u.prompt_logits().begin(), u.prompt_logits().end());
  }
  EXPECT_EQ(joined, logits);
}

TEST(PromptLogits, ARowLargerThanAChunkGoesAlone) {
  const int64_t vocab = (kPromptLogitsChunkBytes / sizeof(float)) + 1;
  cluster::TokenBatch batch;
  AppendPromptLogits(1, Rows(2, vocab), vocab, &batch);
  ASSERT_EQ(batch.updates_size(), 2);
  EXPECT_EQ(batch.updates(0).prompt_logits_size(), vocab);
}

cluster::WorkerMessage Batch(const std::vector<int>& floats_per_update) {
  cluster::WorkerMessage m;
  m.mutable_tokens()->set_step(7);
  for (size_t i = 0; i < floats_per_update.size(); ++i) {
    cluster::SequenceUpdate* u = m.mutable_tokens()->add_updates();
    u->set_request_id(i + 1);
    u->add_token_ids(static_cast<int>(i));
    u->mutable_prompt_logits()->Resize(floats_per_update[i], 0.5f);
  }
  return m;
}

TEST(SplitWorkerMessage, SmallMessagesGoAsTheyAre) {
  cluster::WorkerMessage m = Batch({10, 20});
  auto parts = SplitWorkerMessage(m, 1 << 20);
  ASSERT_EQ(parts.size(), 1u);
  EXPECT_EQ(parts[0].SerializeAsString(), m.SerializeAsString());
}

TEST(SplitWorkerMessage, SpreadsUpdatesOverBoundedMessagesInOrder) {
  const size_t limit = 3 << 20;
  cluster::WorkerMessage m = Batch(std::vector<int>(10, 256 << 10));  // 1 MiB each
  auto parts = SplitWorkerMessage(m, limit);
  EXPECT_GT(parts.size(), 3u);
  std::vector<uint64_t> ids;
  for (const auto& p : parts) {
    EXPECT_LE(p.ByteSizeLong(), limit);
    EXPECT_EQ(p.tokens().step(), 7u);
    for (const auto& u : p.tokens().updates()) ids.push_back(u.request_id());
  }
  EXPECT_EQ(ids, (std::vector<uint64_t>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}));
}

TEST(SplitWorkerMessage, AnUpdateOverTheLimitEndsItsRequestInsteadOfTheSession) {
  const size_t limit = 1 << 20;
  cluster::WorkerMessage m = Batch({100, 1 << 20, 100});  // the middle one is 4 MiB
  auto parts = SplitWorkerMessage(m, limit);
  std::vector<cluster::SequenceUpdate> updates;
  for (const auto& p : parts) {
    EXPECT_LE(p.ByteSizeLong(), limit);
    updates.insert(updates.end(), p.tokens().updates().begin(), p.tokens().updates().end());
  }
  ASSERT_EQ(updates.size(), 3u);
  EXPECT_EQ(updates[0].prompt_logits_size(), 100);
  EXPECT_EQ(updates[1].request_id(), 2u);
  EXPECT_EQ(updates[1].finish_reason(), common::ERROR);
  EXPECT_EQ(updates[1].error_code(), static_cast<int>(absl::StatusCode::kResourceExhausted));
  EXPECT_EQ(updates[2].prompt_logits_size(), 100);
}

}  // namespace
}  // namespace flotilla::worker
