// `--model synthetic:PRESET[:SEED]`: the spec, the values of the synthetic
// checkpoint generated over any range (against a sequential reference
// generator, as the checkpoint writer first defined them), and a rank's shard
// generated in memory against LoadWeights of the written checkpoint, view for
// view and byte for byte.
#include "worker/model/synthetic_shard.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/bf16.h"
#include "common/model_spec.h"
#include "tests/model/bad_synthetic_specs.h"
#include "tests/model/test_util.h"
#include "tools/checkpoint/synthetic_checkpoint.h"
#include "worker/model/checkpoint.h"
#include "worker/model/load_weights.h"
#include "worker/model/model_source.h"
#include "worker/model/synthetic_tensors.h"

namespace flotilla {
namespace {

using testing_util::ScratchDir;

// The generator as first written: one sequential SplitMix64 stream per tensor.
class SequentialStream {
 public:
  explicit SequentialStream(uint64_t state) : state_(state) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  float Normal() {
    uint64_t r = Next();
    float sum = 0;
    for (int i = 0; i < 4; ++i) sum += static_cast<float>((r >> (16 * i)) & 0xffff) + 0.5f;
    return (sum * (1.0f / 65536.0f) - 2.0f) * 1.7320508f;
  }

 private:
  uint64_t state_;
};

std::vector<uint8_t> SequentialReference(const SyntheticTensor& t, int64_t count) {
  SequentialStream stream(t.state0);
  std::vector<uint8_t> out(count * DTypeSize(t.dtype));
  for (int64_t i = 0; i < count; ++i) {
    if (t.fill.kind == SyntheticFillKind::kBytes) {
      if (i % 8 == 0) {
        const uint64_t r = stream.Next();
        std::memcpy(out.data() + i, &r, std::min<int64_t>(8, count - i));
      }
    } else if (t.fill.kind == SyntheticFillKind::kScales) {
      out[i] = static_cast<uint8_t>(t.fill.scale_base + static_cast<int>(stream.Next() % 3) - 1);
    } else {
      const float product = t.fill.stddev * stream.Normal();
      const float v = t.fill.mean + product;
      if (t.dtype == DType::kF32) {
        std::memcpy(out.data() + 4 * i, &v, 4);
      } else {
        const uint16_t b = FloatToBf16(v);
        std::memcpy(out.data() + 2 * i, &b, 2);
      }
    }
  }
  return out;
}

TEST(SyntheticTensors, AnyRangeEqualsTheSequentialStream) {
  const ModelConfig c = ModelConfig::Tiny();
  const struct {
    const char* name;
    DType dtype;
  } tensors[] = {{"model.embed_tokens.weight", DType::kBF16},
                 {"model.layers.1.self_attn.sinks", DType::kF32},
                 {"model.layers.2.mlp.experts.gate_up_proj_blocks", DType::kU8},
                 {"model.layers.0.mlp.experts.down_proj_scales", DType::kU8}};
  constexpr int64_t kCount = (int64_t{1} << 21) + 13;  // several threads' worth, odd end
  for (const auto& t : tensors) {
    SCOPED_TRACE(t.name);
    const SyntheticTensor tensor = SyntheticTensorFor(c, 7, t.name, t.dtype);
    const std::vector<uint8_t> want = SequentialReference(tensor, kCount);
    const int64_t size = DTypeSize(t.dtype);
    std::vector<uint8_t> all(kCount * size);
    FillSyntheticElements(tensor, 0, kCount, all.data());
    EXPECT_EQ(all, want);
    for (int64_t first : {int64_t{0}, int64_t{3}, int64_t{8}, int64_t{1001}, kCount - 9}) {
      const int64_t count = std::min<int64_t>(kCount - first, 77);
      std::vector<uint8_t> part(count * size);
      FillSyntheticElements(tensor, first, count, part.data());
      EXPECT_EQ(0, std::memcmp(part.data(), want.data() + first * size, part.size())) << first;
    }
  }
}

TEST(SyntheticModelSpec, ParsesPresetAndSeed) {
  auto spec = ParseSyntheticModel("synthetic:tiny:7");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->preset, "tiny");
  EXPECT_EQ(spec->seed, 7u);
  EXPECT_EQ(spec->config.ToJson(), ModelConfig::Tiny().ToJson());
  auto no_seed = ParseSyntheticModel("synthetic:120b");
  ASSERT_TRUE(no_seed.ok()) << no_seed.status();
  EXPECT_EQ(no_seed->seed, 0u);
  EXPECT_EQ(no_seed->config.hidden_size, 2880);
  for (const char* preset : {"tiny", "20b", "120b"}) {
    auto config = LoadModelConfig(std::string("synthetic:") + preset);
    auto written = MakeSyntheticConfig(preset, "", {});
    ASSERT_TRUE(config.ok() && written.ok());
    EXPECT_EQ(config->ToJson(), written->ToJson()) << preset;
  }
  EXPECT_EQ(DefaultModelId("synthetic:20b:3"), "synthetic:20b:3");
  EXPECT_EQ(DefaultModelId("/models/gpt-oss-20b/"), "gpt-oss-20b");
}

TEST(SyntheticModelSpec, LayersKeepThePresetsFirstLayers) {
  auto full = ParseSyntheticModel("synthetic:120b:5");
  auto cut = ParseSyntheticModel("synthetic:120b:5:3");
  ASSERT_TRUE(full.ok() && cut.ok()) << cut.status();
  EXPECT_EQ(cut->seed, 5u);
  EXPECT_EQ(cut->config.num_hidden_layers, 3);
  EXPECT_EQ(cut->config.hidden_size, full->config.hidden_size);
  EXPECT_EQ(cut->config.num_local_experts, full->config.num_local_experts);
  ASSERT_EQ(cut->config.layer_types.size(), 3u);
  for (int l = 0; l < 3; ++l) EXPECT_EQ(cut->config.is_sliding(l), full->config.is_sliding(l));
  EXPECT_EQ(DefaultModelId("synthetic:120b:5:3"), "synthetic:120b:5:3");
}

TEST(SyntheticModelSpec, ChainPresetsKeepThePresetsShapes) {
  auto chain = ParseSyntheticModel("synthetic:120b-chain:5:3");
  auto plain = ParseSyntheticModel("synthetic:120b:5:3");
  ASSERT_TRUE(chain.ok() && plain.ok()) << chain.status();
  EXPECT_TRUE(chain->chain);
  EXPECT_FALSE(plain->chain);
  EXPECT_EQ(chain->preset, "120b-chain");
  EXPECT_EQ(chain->seed, 5u);
  EXPECT_EQ(chain->config.ToJson(), plain->config.ToJson());
  auto written = MakeSyntheticConfig("tiny-chain", "", {});
  ASSERT_TRUE(written.ok()) << written.status();
  EXPECT_EQ(written->ToJson(), ModelConfig::Tiny().ToJson());
}

// The chain form changes the embedding's scale and lm_head's rows only:
// lm_head row SyntheticChainNext(x) is embedding row x scaled, for every
// ordinary token x, and the successor map is a permutation of them.
TEST(SyntheticTensors, TheChainFormsLmHeadIsThePermutedEmbedding) {
  const ModelConfig c = ModelConfig::Tiny();
  const int64_t V = c.vocab_size, H = c.hidden_size;
  const int32_t n = SyntheticChainTokens(c);
  EXPECT_EQ(n, 1000);  // below the tiny preset's end-of-sequence token
  auto values = [&](const SyntheticWeights& w, const char* name, int64_t count) {
    std::vector<uint16_t> out(count);
    FillSyntheticElements(SyntheticTensorFor(c, w, name, DType::kBF16), 0, count, out.data());
    return out;
  };
  const SyntheticWeights chain(3, true), plain(3);
  const std::vector<uint16_t> embed = values(chain, "model.embed_tokens.weight", V * H);
  const std::vector<uint16_t> head = values(chain, "lm_head.weight", V * H);
  const std::vector<uint16_t> plain_embed = values(plain, "model.embed_tokens.weight", V * H);
  const std::vector<uint16_t> plain_head = values(plain, "lm_head.weight", V * H);
  const double ratio = 3 / std::sqrt(static_cast<double>(H)) / 32;
  std::vector<bool> seen(n, false);
  for (int32_t x = 0; x < n; ++x) {
    const int32_t v = SyntheticChainNext(c, x);
    ASSERT_GE(v, 0);
    ASSERT_LT(v, n);
    EXPECT_FALSE(seen[v]) << "two tokens lead to " << v;
    seen[v] = true;
    for (int64_t j = 0; j < H; ++j) {
      const double e = Bf16ToFloat(embed[x * H + j]), h = Bf16ToFloat(head[v * H + j]);
      EXPECT_NEAR(h, e * ratio, 0.01 * std::abs(e * ratio) + 1e-6) << x << " " << j;
      EXPECT_NEAR(e, 32 * Bf16ToFloat(plain_embed[x * H + j]), 0.01 * std::abs(e) + 1e-3);
    }
  }
  for (int64_t i = n * H; i < V * H; ++i) EXPECT_EQ(head[i], plain_head[i]) << i;
  EXPECT_EQ(SyntheticChainNext(c, n), -1);
  EXPECT_EQ(SyntheticChainNext(c, -1), -1);
  const char* layer = "model.layers.1.self_attn.q_proj.weight";
  EXPECT_EQ(values(chain, layer, 4096), values(plain, layer, 4096));
  // 120b: the chain stops below the Harmony special tokens.
  EXPECT_EQ(SyntheticChainTokens(ModelConfig::Gptoss120b()), 199998);
}

TEST(SyntheticModelSpec, BadSpecsSayWhatIsWrong) {
  for (const auto& c : testing_util::kBadSyntheticSpecs) {
    auto spec = ParseSyntheticModel(c.spec);
    ASSERT_FALSE(spec.ok()) << c.spec;
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(spec.status().message().find(c.problem), std::string::npos) << spec.status();
    EXPECT_NE(spec.status().message().find(c.spec), std::string::npos) << spec.status();
    EXPECT_FALSE(ModelSource::Open(c.spec).ok());
    EXPECT_FALSE(LoadModelConfig(c.spec).ok());
  }
}

// Element-wise equality of two views (row strides may differ).
void ExpectSame(const Bf16Matrix& a, const Bf16Matrix& b, const std::string& what) {
  ASSERT_EQ(a.rows, b.rows) << what;
  ASSERT_EQ(a.cols, b.cols) << what;
  ASSERT_EQ(a.data == nullptr, b.data == nullptr) << what;
  for (int64_t r = 0; a.data != nullptr && r < a.rows; ++r) {
    ASSERT_EQ(0, std::memcmp(a.data + r * a.row_stride, b.data + r * b.row_stride, 2 * a.cols))
        << what << " row " << r;
  }
}

void ExpectSame(const Bf16Vector& a, const Bf16Vector& b, const std::string& what) {
  ExpectSame(Bf16Matrix{a.data, 1, a.size, a.size}, Bf16Matrix{b.data, 1, b.size, b.size}, what);
}

void ExpectSame(const Mxfp4Matrix& a, const Mxfp4Matrix& b, const std::string& what) {
  ASSERT_EQ(a.rows, b.rows) << what;
  ASSERT_EQ(a.cols, b.cols) << what;
  EXPECT_EQ(0, std::memcmp(a.blocks, b.blocks, a.rows * a.cols / 2)) << what << " blocks";
  EXPECT_EQ(0, std::memcmp(a.scales, b.scales, a.rows * a.cols / 32)) << what << " scales";
}

void ExpectSameAttention(const AttentionWeights& a, const AttentionWeights& b,
                         const std::string& l) {
  EXPECT_EQ(a.q_head_begin, b.q_head_begin);
  EXPECT_EQ(a.q_heads, b.q_heads);
  EXPECT_EQ(a.kv_head_begin, b.kv_head_begin);
  EXPECT_EQ(a.kv_heads, b.kv_heads);
  ExpectSame(a.wq, b.wq, l + "wq");
  ExpectSame(a.bq, b.bq, l + "bq");
  ExpectSame(a.wk, b.wk, l + "wk");
  ExpectSame(a.bk, b.bk, l + "bk");
  ExpectSame(a.wv, b.wv, l + "wv");
  ExpectSame(a.bv, b.bv, l + "bv");
  ExpectSame(a.wo, b.wo, l + "wo");
  ExpectSame(a.bo, b.bo, l + "bo");
  ASSERT_EQ(a.sinks.size(), b.sinks.size());
  EXPECT_EQ(0, std::memcmp(a.sinks.data(), b.sinks.data(), 4 * a.sinks.size())) << l << "sinks";
}

void ExpectSameWeights(const ModelWeights& got, const ModelWeights& want) {
  EXPECT_EQ(got.config.ToJson(), want.config.ToJson());
  ExpectSame(got.embed, want.embed, "embed");
  ExpectSame(got.lm_head, want.lm_head, "lm_head");
  ExpectSame(got.final_norm, want.final_norm, "final_norm");
  ASSERT_EQ(got.layers.size(), want.layers.size());
  for (size_t l = 0; l < got.layers.size(); ++l) {
    const LayerWeights& a = got.layers[l];
    const LayerWeights& b = want.layers[l];
    const std::string where = "layer " + std::to_string(l) + " ";
    ExpectSame(a.input_norm, b.input_norm, where + "input_norm");
    ExpectSame(a.post_attn_norm, b.post_attn_norm, where + "post_attn_norm");
    ExpectSameAttention(a.attn, b.attn, where);
    ExpectSame(a.router, b.router, where + "router");
    ExpectSame(a.router_bias, b.router_bias, where + "router_bias");
    EXPECT_EQ(a.slot_of_expert, b.slot_of_expert);
    ASSERT_EQ(a.experts.size(), b.experts.size());
    for (size_t x = 0; x < a.experts.size(); ++x) {
      const std::string expert = where + "expert " + std::to_string(a.experts[x].expert_id) + " ";
      EXPECT_EQ(a.experts[x].expert_id, b.experts[x].expert_id);
      ExpectSame(a.experts[x].gate_up, b.experts[x].gate_up, expert + "gate_up");
      ExpectSame(a.experts[x].gate_up_bias, b.experts[x].gate_up_bias, expert + "gate_up_bias");
      ExpectSame(a.experts[x].down, b.experts[x].down, expert + "down");
      ExpectSame(a.experts[x].down_bias, b.experts[x].down_bias, expert + "down_bias");
    }
  }
}

// A tiny shape with more heads and experts than Tiny, so shards are interesting.
ModelConfig ShardableConfig(bool tied) {
  ModelConfig c = ModelConfig::Tiny();
  c.num_local_experts = 16;
  c.hidden_size = 96;
  c.intermediate_size = 64;
  c.vocab_size = 300;
  c.eos_token_ids = {299};
  c.pad_token_id = 298;
  c.tie_word_embeddings = tied;
  return c;
}

std::shared_ptr<const Checkpoint> WriteAndOpen(const ModelConfig& c, uint64_t seed, int files) {
  const std::string dir = ScratchDir("checkpoint");
  SyntheticCheckpointOptions o;
  o.seed = seed;
  o.shards = files;
  absl::Status st = WriteSyntheticCheckpoint(c, o, dir);
  EXPECT_TRUE(st.ok()) << st;
  auto ck = Checkpoint::Open(dir);
  EXPECT_TRUE(ck.ok()) << ck.status();
  return ck.ok() ? std::shared_ptr<const Checkpoint>(*std::move(ck)) : nullptr;
}

TEST(SyntheticShard, EqualsLoadWeightsOfTheWrittenCheckpoint) {
  const ModelConfig c = ShardableConfig(/*tied=*/false);
  auto ck = WriteAndOpen(c, 11, /*files=*/3);
  ASSERT_NE(ck, nullptr);
  std::vector<ShardSpec> shards(4);
  shards[1].tp_rank = 1;  // tp 2, a subset of experts out of order
  shards[1].tp_size = 2;
  shards[1].experts = {9, 2, 15, 3};
  shards[2].tp_rank = 0;
  shards[2].tp_size = 2;
  shards[2].experts = {0, 1, 2, 3, 4, 5, 6, 7};
  shards[2].load_embedding = false;
  shards[3].tp_rank = 1;  // every kv head split: one q head group per rank
  shards[3].tp_size = 2;
  shards[3].load_lm_head = false;
  for (const ShardSpec& shard : shards) {
    SCOPED_TRACE(testing::Message() << "tp " << shard.tp_rank << "/" << shard.tp_size << ", "
                                    << shard.experts.size() << " experts");
    auto want = LoadWeights(ck, shard);
    ASSERT_TRUE(want.ok()) << want.status();
    auto got = MakeSyntheticShard(c, 11, shard);
    ASSERT_TRUE(got.ok()) << got.status();
    ExpectSameWeights(*got, *want);
  }
}

TEST(SyntheticShard, TiedEmbeddingsGiveTheEmbeddingAsLmHead) {
  const ModelConfig c = ShardableConfig(/*tied=*/true);
  auto ck = WriteAndOpen(c, 4, /*files=*/1);
  ASSERT_NE(ck, nullptr);
  auto want = LoadWeights(ck, ShardSpec{});
  auto got = MakeSyntheticShard(c, 4, ShardSpec{});
  ASSERT_TRUE(want.ok() && got.ok());
  ExpectSameWeights(*got, *want);
}

TEST(SyntheticShard, RejectsTheShardsLoadWeightsRejects) {
  const ModelConfig c = ShardableConfig(false);
  ShardSpec bad_tp;
  bad_tp.tp_size = 3;
  ShardSpec bad_expert;
  bad_expert.experts = {1, 16};
  ShardSpec twice;
  twice.experts = {2, 2};
  for (const ShardSpec& s : {bad_tp, bad_expert, twice}) {
    auto got = MakeSyntheticShard(c, 1, s);
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << got.status();
  }
}

TEST(SyntheticShard, ModelSourceResolvesTheSpecToTheWrittenCheckpoint) {
  auto source = ModelSource::Open("synthetic:tiny:7");
  ASSERT_TRUE(source.ok()) << source.status();
  ASSERT_NE((*source)->synthetic(), nullptr);
  EXPECT_EQ((*source)->synthetic()->seed, 7u);
  auto ck = WriteAndOpen(ModelConfig::Tiny(), 7, 1);
  ASSERT_NE(ck, nullptr);
  ShardSpec shard;
  shard.tp_rank = 1;
  shard.tp_size = 2;
  shard.experts = {1, 4, 6};
  auto got = (*source)->LoadShard(shard);
  auto want = LoadWeights(ck, shard);
  ASSERT_TRUE(got.ok() && want.ok());
  ExpectSameWeights(*got, *want);

  auto dir = ModelSource::Open(ck->dir());
  ASSERT_TRUE(dir.ok()) << dir.status();
  EXPECT_EQ((*dir)->synthetic(), nullptr);
  EXPECT_EQ((*dir)->config().ToJson(), ModelConfig::Tiny().ToJson());
}

}  // namespace
}  // namespace flotilla
