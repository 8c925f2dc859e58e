// A CPU engine on synthetic weights for tests (the tiny preset unless told):
// KV blocks of 4 tokens, so short prompts already span several blocks.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "common/model_config.h"
#include "worker/engine/cpu_engine.h"
#include "worker/model/synthetic_weights.h"

namespace flotilla::testing_util {

// An engine of `config` on the synthetic weights of `seed`, with `blocks`
// KV blocks; `pool` null: the engine's own threads. Null (with a test
// failure naming why) when it cannot be made.
inline std::unique_ptr<CpuEngine> SmallCpuEngine(const ModelConfig& config = ModelConfig::Tiny(),
                                                 int64_t blocks = 256, uint64_t seed = 1,
                                                 kernels::cpu::ThreadPool* pool = nullptr) {
  absl::StatusOr<ModelWeights> weights = MakeSyntheticWeights(config, seed);
  EXPECT_TRUE(weights.ok()) << weights.status();
  if (!weights.ok()) return nullptr;
  CpuEngineOptions o;
  o.kv_block_size = 4;
  o.kv_num_blocks = blocks;
  absl::StatusOr<std::unique_ptr<CpuEngine>> engine =
      CpuEngine::Create(std::move(*weights), o, pool);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return engine.ok() ? std::move(*engine) : nullptr;
}

}  // namespace flotilla::testing_util
