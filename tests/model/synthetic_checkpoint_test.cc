#include "tools/checkpoint/synthetic_checkpoint.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>

#include "common/bf16.h"
#include "tests/model/test_util.h"
#include "worker/model/checkpoint.h"

namespace flotilla {
namespace {

using testing_util::ScratchDir;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

ModelConfig Small() { return testing_util::TinyWithVocab(128); }

std::string Write(const std::string& name, const ModelConfig& c, uint64_t seed, int shards = 1) {
  std::string dir = ScratchDir(name);
  SyntheticCheckpointOptions o;
  o.seed = seed;
  o.shards = shards;
  absl::Status st = WriteSyntheticCheckpoint(c, o, dir);
  EXPECT_TRUE(st.ok()) << st;
  return dir;
}

TEST(SyntheticCheckpoint, DeterministicFromTheSeed) {
  const std::string a = ReadFile(Write("a", Small(), 5) + "/model.safetensors");
  const std::string b = ReadFile(Write("b", Small(), 5) + "/model.safetensors");
  const std::string c = ReadFile(Write("c", Small(), 6) + "/model.safetensors");
  ASSERT_GT(a.size(), 1000u);
  EXPECT_EQ(a, b);
  EXPECT_EQ(a.size(), c.size());
  EXPECT_NE(a, c);
}

TEST(SyntheticCheckpoint, ConfigReadsBackUnchanged) {
  ModelConfig c = Small();
  auto back = ModelConfig::Load(Write("ck", c, 1));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->ToJson(), c.ToJson());
}

TEST(SyntheticCheckpoint, RewritingSwitchesLayoutCleanly) {
  std::string dir = ScratchDir("ck");
  SyntheticCheckpointOptions o;
  o.shards = 3;
  ASSERT_TRUE(WriteSyntheticCheckpoint(Small(), o, dir).ok());
  o.shards = 1;
  ASSERT_TRUE(WriteSyntheticCheckpoint(Small(), o, dir).ok());
  EXPECT_FALSE(std::filesystem::exists(dir + "/model.safetensors.index.json"));
  EXPECT_FALSE(std::filesystem::exists(dir + "/model-00001-of-00003.safetensors"));
  auto ck = Checkpoint::Open(dir);
  ASSERT_TRUE(ck.ok()) << ck.status();
  EXPECT_TRUE((*ck)->Validate().ok());
}

// A run that fails part-way (here: a shard count found impossible only after
// config.json was written) leaves nothing under the final name, and an earlier
// checkpoint there untouched; no staging directory is left beside it.
TEST(SyntheticCheckpoint, AFailedWriteLeavesNoPartialCheckpoint) {
  namespace fs = std::filesystem;
  const std::string dir = ScratchDir("ck-atomic") + "/out";
  SyntheticCheckpointOptions o;
  o.shards = 80;
  EXPECT_FALSE(WriteSyntheticCheckpoint(Small(), o, dir).ok());
  EXPECT_FALSE(fs::exists(dir));
  o.shards = 2;
  ASSERT_TRUE(WriteSyntheticCheckpoint(Small(), o, dir + "/").ok());
  o.shards = 80;
  EXPECT_FALSE(WriteSyntheticCheckpoint(Small(), o, dir).ok());
  auto ck = Checkpoint::Open(dir);
  ASSERT_TRUE(ck.ok()) << ck.status();
  EXPECT_TRUE((*ck)->Validate().ok());
  for (const auto& entry : fs::directory_iterator(fs::path(dir).parent_path())) {
    EXPECT_EQ(entry.path().filename().string().find(".out.partial"), std::string::npos)
        << entry.path();
  }
}

// Values have the magnitudes the writer promises (a model that neither
// explodes nor vanishes): checked on the decoded tensors.
TEST(SyntheticCheckpoint, ValueDistributionsAreSane) {
  ModelConfig c = Small();
  auto ck = Checkpoint::Open(Write("ck", c, 3));
  ASSERT_TRUE(ck.ok()) << ck.status();
  auto stats = [&](const std::string& name, double* mean, double* rms) {
    const TensorInfo* t = (*ck)->Find(name);
    ASSERT_NE(t, nullptr) << name;
    const uint16_t* p = reinterpret_cast<const uint16_t*>(t->data);
    double s = 0, s2 = 0;
    for (int64_t i = 0; i < t->num_elements(); ++i) {
      double v = Bf16ToFloat(p[i]);
      s += v;
      s2 += v * v;
    }
    *mean = s / t->num_elements();
    *rms = std::sqrt(s2 / t->num_elements());
  };
  double mean, rms;
  stats("model.embed_tokens.weight", &mean, &rms);
  EXPECT_NEAR(mean, 0, 0.05);
  EXPECT_NEAR(rms, 1, 0.05);
  stats("model.layers.0.input_layernorm.weight", &mean, &rms);
  EXPECT_NEAR(mean, 1, 0.05);
  stats("model.layers.1.self_attn.q_proj.weight", &mean, &rms);
  EXPECT_NEAR(rms, 1.2 / 8, 0.02);  // 1.2 / sqrt(H)
  stats("model.layers.1.mlp.router.bias", &mean, &rms);
  EXPECT_GT(rms, 0.1);  // biases are not trivial

  // MXFP4 experts: every scale within one step of the base, and decoded
  // weights of rms about 1/sqrt(fan_in).
  static constexpr float kFp4[16] = {0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6};
  const TensorInfo* blocks = (*ck)->Find("model.layers.2.mlp.experts.gate_up_proj_blocks");
  const TensorInfo* scales = (*ck)->Find("model.layers.2.mlp.experts.gate_up_proj_scales");
  ASSERT_EQ(blocks->nbytes, scales->nbytes * 16);
  int min_scale = 255, max_scale = 0;
  double s2 = 0;
  int nibble_counts[16] = {};
  for (int64_t g = 0; g < scales->nbytes; ++g) {
    const int sc = scales->data[g];
    min_scale = std::min(min_scale, sc);
    max_scale = std::max(max_scale, sc);
    for (int j = 0; j < 16; ++j) {
      const uint8_t b = blocks->data[g * 16 + j];
      for (int nib : {b & 0xf, b >> 4}) {
        ++nibble_counts[nib];
        const double v = std::ldexp(kFp4[nib], sc - 127);
        s2 += v * v;
      }
    }
  }
  EXPECT_EQ(max_scale - min_scale, 2);
  const double w_rms = std::sqrt(s2 / (scales->nbytes * 32.0));
  EXPECT_GT(w_rms, 0.5 / 8);  // within a factor of 2 of 1/sqrt(H) = 1/8
  EXPECT_LT(w_rms, 2.0 / 8);
  for (int n : nibble_counts) EXPECT_GT(n, 0);
}

TEST(SyntheticCheckpoint, ShardCountIsChecked) {
  SyntheticCheckpointOptions o;
  o.shards = 0;
  absl::Status st = WriteSyntheticCheckpoint(Small(), o, ScratchDir("ck"));
  EXPECT_NE(st.message().find("shards must be in [1, 79]"), absl::string_view::npos) << st;
  o.shards = 80;
  EXPECT_FALSE(WriteSyntheticCheckpoint(Small(), o, ScratchDir("ck2")).ok());
  o.shards = 79;  // one tensor per file still works
  std::string dir = ScratchDir("ck3");
  ASSERT_TRUE(WriteSyntheticCheckpoint(Small(), o, dir).ok());
  auto ck = Checkpoint::Open(dir);
  ASSERT_TRUE(ck.ok()) << ck.status();
  EXPECT_EQ((*ck)->files().size(), 79u);
  EXPECT_TRUE((*ck)->Validate().ok());
}

TEST(SyntheticCheckpoint, SinksDtypeIsChecked) {
  SyntheticCheckpointOptions o;
  o.sinks_dtype = DType::kU8;
  EXPECT_FALSE(WriteSyntheticCheckpoint(Small(), o, ScratchDir("ck")).ok());
}

TEST(SyntheticCheckpoint, UnwritableDirectoryIsAnError) {
  std::string dir = ScratchDir("ck");
  std::ofstream(dir + "/file") << "x";
  absl::Status st = WriteSyntheticCheckpoint(Small(), {}, dir + "/file/sub");
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("file/sub"), absl::string_view::npos) << st;
}

TEST(SyntheticCheckpoint, InvalidConfigIsRejectedBeforeWriting) {
  ModelConfig c = Small();
  c.num_key_value_heads = 3;  // does not divide 8
  absl::Status st = WriteSyntheticCheckpoint(c, {}, ScratchDir("ck"));
  EXPECT_NE(st.message().find("num_key_value_heads"), absl::string_view::npos) << st;
}

TEST(MakeSyntheticConfig, PresetsAndOverrides) {
  auto c = MakeSyntheticConfig("120b", "", {});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_local_experts, 128);
  EXPECT_EQ(c->num_hidden_layers, 36);
  c = MakeSyntheticConfig("20b", "", {"num_hidden_layers=3", "rope_scaling.factor=8",
                                       "num_experts_per_tok=2", "sliding_window=64"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_local_experts, 32);
  EXPECT_EQ(c->num_hidden_layers, 3);
  ASSERT_EQ(c->layer_types.size(), 3u);
  EXPECT_EQ(c->layer_types[2], LayerType::kSlidingAttention);
  EXPECT_EQ(c->rope_scaling.factor, 8);
  EXPECT_EQ(c->num_experts_per_tok, 2);
  EXPECT_EQ(c->sliding_window, 64);
  c = MakeSyntheticConfig("tiny", "", {"experts_per_token=3"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_experts_per_tok, 3);
}

TEST(MakeSyntheticConfig, FromAConfigFile) {
  std::string dir = ScratchDir("cfg");
  ModelConfig base = Small();
  base.hidden_size = 96;
  std::ofstream(dir + "/config.json") << base.ToJson().dump();
  auto c = MakeSyntheticConfig("120b", dir + "/config.json", {"vocab_size=100"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->hidden_size, 96);
  EXPECT_EQ(c->vocab_size, 100);
}

TEST(MakeSyntheticConfig, ClearErrors) {
  auto err = [](absl::string_view preset, const std::string& file,
                const std::vector<std::string>& sets) {
    auto c = MakeSyntheticConfig(preset, file, sets);
    return c.ok() ? std::string() : std::string(c.status().message());
  };
  EXPECT_NE(err("7b", "", {}).find("unknown preset '7b'"), std::string::npos);
  EXPECT_NE(err("tiny", "/nonexistent/config.json", {}).find("cannot open"), std::string::npos);
  EXPECT_NE(err("tiny", "", {"hidden_size"}).find("expected key=value"), std::string::npos);
  EXPECT_NE(err("tiny", "", {"=3"}).find("expected key=value"), std::string::npos);
  EXPECT_NE(err("tiny", "", {"hidden_size=abc"}).find("'hidden_size' must be an integer"),
            std::string::npos);
  EXPECT_NE(err("tiny", "", {"hidden_size=48"}).find("multiples of 32"), std::string::npos);
  EXPECT_NE(err("tiny", "", {"vocab_size.x=1"}).find("'vocab_size' is not an object"),
            std::string::npos);
  EXPECT_NE(err("tiny", "", {"num_hidden_layers=3", "layer_types=[\"full_attention\"]"})
                .find("layer_types has 1 entries"),
            std::string::npos);
}

}  // namespace
}  // namespace flotilla
