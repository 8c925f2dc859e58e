// `flotilla up --model synthetic:tiny:3`: real coordinator and worker
// processes with no checkpoint on disk (each worker generates its shard)
// serve the tokens of the checkpoint `make-checkpoint --preset tiny --seed 3`
// writes, under the spec as the model id.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "kernels/cpu/thread_pool.h"
#include "proto/flotilla.grpc.pb.h"
#include "tests/cluster/greedy_client.h"
#include "tests/cluster_options.h"
#include "tests/grpc_stub.h"
#include "tests/model/written_checkpoint.h"
#include "tools/checkpoint/synthetic_checkpoint.h"
#include "tools/cli/local_cluster.h"
#include "worker/engine/cpu_engine.h"
#include "worker/engine/generate.h"
#include "worker/model/checkpoint.h"
#include "worker/model/load_weights.h"

namespace flotilla {
namespace {
namespace fs = std::filesystem;

constexpr int kMaxTokens = 10;

std::vector<int32_t> FromWrittenCheckpoint(const std::vector<int32_t>& prompt) {
  const testing_util::WrittenTinyCheckpoint written("flotilla-synthetic-cluster", 3);
  if (written.checkpoint() == nullptr) return {};
  const std::shared_ptr<const Checkpoint>& ck = written.checkpoint();
  kernels::cpu::ThreadPool pool(1);
  CpuEngineOptions eo;
  eo.kv_num_blocks = CpuEngine::KvBlocksFor(ck->config(), ck->config().num_key_value_heads, 16, 1,
                                            prompt.size() + kMaxTokens);
  auto engine = *CpuEngine::Create(*LoadWeights(ck, ShardSpec{}), eo, &pool);
  GenerateOptions go;
  go.sampling.temperature = 0;
  go.sampling.max_tokens = kMaxTokens;
  go.sampling.stop_token_ids = std::vector<int>{};  // as ignore_eos with no stop tokens below
  auto result = flotilla::Generate(*engine, prompt, go);
  return result.ok() ? result->tokens : std::vector<int32_t>{};
}

TEST(ClusterSynthetic, ServesTheWrittenCheckpointsTokensWithNoCheckpoint) {
  cli::LocalClusterOptions o =
      testing_util::TestClusterOptions("synthetic:tiny:3", 2, 0, "synthetic-cluster-log");
  o.http_listen = "";
  auto cluster = cli::LocalCluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto stub = testing_util::PlainStub<v1::Flotilla>((*cluster)->address());

  grpc::ClientContext list_ctx;
  v1::ListModelsResponse models;
  ASSERT_TRUE(stub->ListModels(&list_ctx, v1::ListModelsRequest(), &models).ok());
  ASSERT_EQ(models.models_size(), 1);
  EXPECT_EQ(models.models(0).id(), "synthetic:tiny:3");
  EXPECT_EQ(models.models(0).vocab_size(), 1024u);

  const std::vector<int32_t> prompt = {1, 2, 3, 900, 17};
  const cluster_test::Streamed reply =
      cluster_test::GreedyGenerate((*cluster)->address(), prompt, kMaxTokens, {.ignore_eos = true});
  ASSERT_TRUE(reply.status.ok()) << reply.status.error_message();
  const std::vector<int32_t>& tokens = reply.tokens;
  EXPECT_EQ(tokens, FromWrittenCheckpoint(prompt));
  EXPECT_EQ(tokens.size(), static_cast<size_t>(kMaxTokens));
  (*cluster)->Stop();
}

TEST(ClusterSynthetic, BadSpecIsRefusedBeforeAnyProcessStarts) {
  cli::LocalClusterOptions o;
  o.model = "synthetic:huge:1";
  o.bin_dir = FLOTILLA_BIN_DIR;
  auto cluster = cli::LocalCluster::Start(o);
  ASSERT_FALSE(cluster.ok());
  EXPECT_NE(cluster.status().message().find("unknown preset 'huge'"), std::string::npos)
      << cluster.status();
}

}  // namespace
}  // namespace flotilla
