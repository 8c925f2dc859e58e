// Writer -> Checkpoint -> LoadWeights round trips, shard subsets, and every
// kind of bad checkpoint (each must give a clear error, never a crash).
#include "worker/model/checkpoint.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "common/bf16.h"
#include "tests/model/test_util.h"
#include "tools/checkpoint/synthetic_checkpoint.h"
#include "worker/model/load_weights.h"

namespace flotilla {
namespace {

using testing_util::Entry;
using testing_util::ReadEntries;
using testing_util::ScratchDir;
using testing_util::WriteSafetensors;

ModelConfig TinyConfig() { return testing_util::TinyWithVocab(256); }

std::string MakeCheckpoint(const std::string& name, const ModelConfig& c, int shards = 1,
                           uint64_t seed = 7, DType sinks = DType::kBF16) {
  std::string dir = ScratchDir(name);
  SyntheticCheckpointOptions o;
  o.seed = seed;
  o.shards = shards;
  o.sinks_dtype = sinks;
  absl::Status st = WriteSyntheticCheckpoint(c, o, dir);
  EXPECT_TRUE(st.ok()) << st;
  return dir;
}

std::shared_ptr<const Checkpoint> OpenOrDie(const std::string& dir) {
  auto ck = Checkpoint::Open(dir);
  EXPECT_TRUE(ck.ok()) << ck.status();
  if (!ck.ok()) return nullptr;
  return std::shared_ptr<const Checkpoint>(std::move(*ck));
}

const uint16_t* Bf16(const Checkpoint& ck, const std::string& name) {
  const TensorInfo* t = ck.Find(name);
  EXPECT_NE(t, nullptr) << name;
  return t == nullptr ? nullptr : reinterpret_cast<const uint16_t*>(t->data);
}

std::string L(int layer, const char* suffix) { return LayerTensorName(layer, suffix); }

// ---- round trips ------------------------------------------------------------

TEST(ExpectedTensors, ListsEveryTensorOfTheLayout) {
  ModelConfig c = TinyConfig();
  std::vector<TensorSpec> t = ExpectedTensors(c);
  ASSERT_EQ(t.size(), 3u + 19u * c.num_hidden_layers);
  EXPECT_EQ(t.front().name, "model.embed_tokens.weight");
  EXPECT_EQ(t.back().name, "lm_head.weight");
  for (const TensorSpec& s : t) {
    if (s.name == "model.layers.2.mlp.experts.gate_up_proj_blocks") {
      EXPECT_EQ(s.dtype, DType::kU8);
      EXPECT_EQ(s.shape, (std::vector<int64_t>{8, 128, 2, 16}));
    }
    if (s.name == "model.layers.0.self_attn.o_proj.weight") {
      EXPECT_EQ(s.shape, (std::vector<int64_t>{64, 128}));
    }
  }
  c.tie_word_embeddings = true;
  EXPECT_EQ(ExpectedTensors(c).size(), 2u + 19u * c.num_hidden_layers);
}

TEST(Checkpoint, SingleFileRoundTrip) {
  ModelConfig c = TinyConfig();
  auto ck = OpenOrDie(MakeCheckpoint("ck", c));
  ASSERT_NE(ck, nullptr);
  EXPECT_EQ(ck->files().size(), 1u);
  EXPECT_TRUE(ck->Validate().ok()) << ck->Validate();
  EXPECT_EQ(ck->config().hidden_size, c.hidden_size);
  EXPECT_EQ(ck->TensorNames().size(), ExpectedTensors(c).size());
  EXPECT_EQ(ck->files()[0]->metadata().at("format"), "pt");

  auto w = LoadWeights(ck, ShardSpec{});
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->layers.size(), 4u);
  EXPECT_EQ(w->embed.data, Bf16(*ck, "model.embed_tokens.weight"));
  EXPECT_EQ(w->embed.rows, 256);
  EXPECT_EQ(w->embed.cols, 64);
  EXPECT_EQ(w->lm_head.data, Bf16(*ck, "lm_head.weight"));
  EXPECT_EQ(w->final_norm.data, Bf16(*ck, "model.norm.weight"));
  const LayerWeights& l3 = w->layers[3];
  EXPECT_EQ(l3.input_norm.data, Bf16(*ck, L(3, "input_layernorm.weight")));
  EXPECT_EQ(l3.post_attn_norm.data, Bf16(*ck, L(3, "post_attention_layernorm.weight")));
  EXPECT_EQ(l3.attn.wq.data, Bf16(*ck, L(3, "self_attn.q_proj.weight")));
  EXPECT_EQ(l3.attn.wq.rows, 8 * 16);
  EXPECT_EQ(l3.attn.wk.rows, 2 * 16);
  EXPECT_EQ(l3.attn.wo.rows, 64);
  EXPECT_EQ(l3.attn.wo.cols, 128);
  EXPECT_EQ(l3.attn.wo.row_stride, 128);
  EXPECT_EQ(l3.router.data, Bf16(*ck, L(3, "mlp.router.weight")));
  EXPECT_EQ(l3.router.rows, 8);
  ASSERT_EQ(l3.experts.size(), 8u);
  for (int e = 0; e < 8; ++e) {
    EXPECT_EQ(l3.slot_of_expert[e], e);
    EXPECT_EQ(l3.experts[e].expert_id, e);
  }
  const TensorInfo* gub = ck->Find(L(3, "mlp.experts.gate_up_proj_blocks"));
  EXPECT_EQ(l3.experts[5].gate_up.blocks, gub->data + 5 * 128 * 2 * 16);
  EXPECT_EQ(l3.experts[5].gate_up.rows, 128);
  EXPECT_EQ(l3.experts[5].gate_up.cols, 64);
  EXPECT_EQ(l3.experts[5].down.rows, 64);
  EXPECT_EQ(l3.experts[5].down.cols, 64);
  EXPECT_EQ(l3.experts[5].down_bias.size, 64);
  // Sinks are the only converted values.
  const uint16_t* sinks = Bf16(*ck, L(3, "self_attn.sinks"));
  ASSERT_EQ(l3.attn.sinks.size(), 8u);
  for (int h = 0; h < 8; ++h) EXPECT_EQ(l3.attn.sinks[h], Bf16ToFloat(sinks[h]));
  // The views outlive every handle but the weights' own.
  const uint16_t* embed = w->embed.data;
  uint16_t first = embed[0];
  ck.reset();
  EXPECT_EQ(w->embed.data[0], first);
}

TEST(Checkpoint, ShardedRoundTripHoldsTheSameTensors) {
  ModelConfig c = TinyConfig();
  auto one = OpenOrDie(MakeCheckpoint("one", c, 1));
  auto many = OpenOrDie(MakeCheckpoint("many", c, 3));
  ASSERT_NE(one, nullptr);
  ASSERT_NE(many, nullptr);
  EXPECT_EQ(many->files().size(), 3u);
  EXPECT_TRUE(many->Validate().ok()) << many->Validate();
  ASSERT_EQ(one->TensorNames(), many->TensorNames());
  for (const std::string& name : one->TensorNames()) {
    const TensorInfo* a = one->Find(name);
    const TensorInfo* b = many->Find(name);
    ASSERT_EQ(a->nbytes, b->nbytes) << name;
    EXPECT_EQ(std::memcmp(a->data, b->data, a->nbytes), 0) << name;
  }
  std::ifstream index(many->dir() + "/model.safetensors.index.json");
  nlohmann::json j = nlohmann::json::parse(index);
  EXPECT_EQ(j["weight_map"]["lm_head.weight"], "model-00003-of-00003.safetensors");
  EXPECT_EQ(j["weight_map"]["model.embed_tokens.weight"], "model-00001-of-00003.safetensors");
  EXPECT_TRUE(j["metadata"]["total_size"].is_number_integer());
  auto w = LoadWeights(many, ShardSpec{});
  ASSERT_TRUE(w.ok()) << w.status();
}

TEST(Checkpoint, F32SinksAreAccepted) {
  auto ck = OpenOrDie(MakeCheckpoint("ck", TinyConfig(), 1, 7, DType::kF32));
  ASSERT_NE(ck, nullptr);
  EXPECT_EQ(ck->Find(L(0, "self_attn.sinks"))->dtype, DType::kF32);
  EXPECT_TRUE(ck->Validate().ok());
  auto w = LoadWeights(ck, ShardSpec{});
  ASSERT_TRUE(w.ok()) << w.status();
  float s1;
  std::memcpy(&s1, ck->Find(L(1, "self_attn.sinks"))->data + 4, 4);
  EXPECT_EQ(w->layers[1].attn.sinks[1], s1);
}

TEST(Checkpoint, TiedEmbeddingsServeAsLmHead) {
  ModelConfig c = TinyConfig();
  c.tie_word_embeddings = true;
  auto ck = OpenOrDie(MakeCheckpoint("ck", c));
  ASSERT_NE(ck, nullptr);
  EXPECT_EQ(ck->Find("lm_head.weight"), nullptr);
  auto w = LoadWeights(ck, ShardSpec{});
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->lm_head.data, w->embed.data);
}

// ---- subsets ----------------------------------------------------------------

TEST(LoadWeights, TensorParallelSliceIsTheRightRowsAndColumns) {
  ModelConfig c = TinyConfig();  // NH=8, NKV=2, D=16, H=64
  auto ck = OpenOrDie(MakeCheckpoint("ck", c));
  ASSERT_NE(ck, nullptr);
  const int D = 16, H = 64, NH = 8;
  for (int rank = 0; rank < 2; ++rank) {
    ShardSpec s;
    s.tp_rank = rank;
    s.tp_size = 2;
    s.load_embedding = false;
    s.load_lm_head = false;
    auto w = LoadWeights(ck, s);
    ASSERT_TRUE(w.ok()) << w.status();
    EXPECT_EQ(w->embed.data, nullptr);
    EXPECT_EQ(w->lm_head.data, nullptr);
    for (int l = 0; l < 4; ++l) {
      const AttentionWeights& a = w->layers[l].attn;
      EXPECT_EQ(a.q_head_begin, 4 * rank);
      EXPECT_EQ(a.q_heads, 4);
      EXPECT_EQ(a.kv_head_begin, rank);
      EXPECT_EQ(a.kv_heads, 1);
      const uint16_t* q = Bf16(*ck, L(l, "self_attn.q_proj.weight"));
      const uint16_t* bq = Bf16(*ck, L(l, "self_attn.q_proj.bias"));
      const uint16_t* k = Bf16(*ck, L(l, "self_attn.k_proj.weight"));
      const uint16_t* v = Bf16(*ck, L(l, "self_attn.v_proj.weight"));
      const uint16_t* bv = Bf16(*ck, L(l, "self_attn.v_proj.bias"));
      const uint16_t* o = Bf16(*ck, L(l, "self_attn.o_proj.weight"));
      const uint16_t* sinks = Bf16(*ck, L(l, "self_attn.sinks"));
      ASSERT_EQ(a.wq.rows, 4 * D);
      ASSERT_EQ(a.wk.rows, D);
      ASSERT_EQ(a.wo.rows, H);
      ASSERT_EQ(a.wo.cols, 4 * D);
      ASSERT_EQ(a.wo.row_stride, NH * D);
      for (int r = 0; r < a.wq.rows; ++r) {
        for (int col = 0; col < H; ++col) {
          ASSERT_EQ(a.wq.data[r * a.wq.row_stride + col], q[(rank * 4 * D + r) * H + col]);
        }
        ASSERT_EQ(a.bq.data[r], bq[rank * 4 * D + r]);
      }
      for (int r = 0; r < D; ++r) {
        for (int col = 0; col < H; ++col) {
          ASSERT_EQ(a.wk.data[r * H + col], k[(rank * D + r) * H + col]);
          ASSERT_EQ(a.wv.data[r * H + col], v[(rank * D + r) * H + col]);
        }
        ASSERT_EQ(a.bv.data[r], bv[rank * D + r]);
      }
      for (int r = 0; r < H; ++r) {
        for (int col = 0; col < 4 * D; ++col) {
          ASSERT_EQ(a.wo.data[r * a.wo.row_stride + col], o[r * NH * D + rank * 4 * D + col]);
        }
      }
      EXPECT_EQ(a.bo.data, Bf16(*ck, L(l, "self_attn.o_proj.bias")));
      ASSERT_EQ(a.sinks.size(), 4u);
      for (int h = 0; h < 4; ++h) EXPECT_EQ(a.sinks[h], Bf16ToFloat(sinks[rank * 4 + h]));
    }
  }
}

TEST(LoadWeights, ExpertSubsetViewsTheRightExperts) {
  ModelConfig c = TinyConfig();  // E=8, H=I=64
  auto ck = OpenOrDie(MakeCheckpoint("ck", c, 2));
  ASSERT_NE(ck, nullptr);
  ShardSpec s;
  s.experts = {6, 1, 3};
  auto w = LoadWeights(ck, s);
  ASSERT_TRUE(w.ok()) << w.status();
  const int64_t gu_block_bytes = 128 * 2 * 16, gu_scale_bytes = 128 * 2;
  const int64_t dn_block_bytes = 64 * 2 * 16, dn_scale_bytes = 64 * 2;
  for (int l = 0; l < 4; ++l) {
    const LayerWeights& lw = w->layers[l];
    ASSERT_EQ(lw.experts.size(), 3u);
    EXPECT_EQ(lw.slot_of_expert, (std::vector<int>{-1, 1, -1, 2, -1, -1, 0, -1}));
    const uint8_t* gub = ck->Find(L(l, "mlp.experts.gate_up_proj_blocks"))->data;
    const uint8_t* gus = ck->Find(L(l, "mlp.experts.gate_up_proj_scales"))->data;
    const uint16_t* gubias = Bf16(*ck, L(l, "mlp.experts.gate_up_proj_bias"));
    const uint8_t* dnb = ck->Find(L(l, "mlp.experts.down_proj_blocks"))->data;
    const uint8_t* dns = ck->Find(L(l, "mlp.experts.down_proj_scales"))->data;
    const uint16_t* dnbias = Bf16(*ck, L(l, "mlp.experts.down_proj_bias"));
    for (size_t slot = 0; slot < 3; ++slot) {
      const ExpertWeights& ex = lw.experts[slot];
      const int e = s.experts[slot];
      EXPECT_EQ(ex.expert_id, e);
      EXPECT_EQ(std::memcmp(ex.gate_up.blocks, gub + e * gu_block_bytes, gu_block_bytes), 0);
      EXPECT_EQ(std::memcmp(ex.gate_up.scales, gus + e * gu_scale_bytes, gu_scale_bytes), 0);
      EXPECT_EQ(std::memcmp(ex.gate_up_bias.data, gubias + e * 128, 128 * 2), 0);
      EXPECT_EQ(std::memcmp(ex.down.blocks, dnb + e * dn_block_bytes, dn_block_bytes), 0);
      EXPECT_EQ(std::memcmp(ex.down.scales, dns + e * dn_scale_bytes, dn_scale_bytes), 0);
      EXPECT_EQ(std::memcmp(ex.down_bias.data, dnbias + e * 64, 64 * 2), 0);
      EXPECT_EQ(ex.gate_up_bias.size, 128);
    }
  }
}

// ---- bad shard specs ----------------------------------------------------------

class BadShard : public ::testing::Test {
 protected:
  void SetUp() override { ck_ = OpenOrDie(MakeCheckpoint("ck", TinyConfig())); }
  std::string Error(const ShardSpec& s) {
    auto w = LoadWeights(ck_, s);
    return w.ok() ? "" : std::string(w.status().message());
  }
  std::shared_ptr<const Checkpoint> ck_;
};

TEST_F(BadShard, TpSizeMustDivideHeadCounts) {
  ShardSpec s;
  s.tp_size = 4;  // divides NH=8 but not NKV=2
  EXPECT_NE(Error(s).find("tp_size 4 must divide"), std::string::npos) << Error(s);
  s.tp_size = 0;
  EXPECT_NE(Error(s).find("tp_size must be >= 1"), std::string::npos) << Error(s);
}

TEST_F(BadShard, TpRankOutOfRange) {
  ShardSpec s;
  s.tp_size = 2;
  s.tp_rank = 2;
  EXPECT_NE(Error(s).find("tp_rank 2"), std::string::npos) << Error(s);
  s.tp_rank = -1;
  EXPECT_NE(Error(s).find("tp_rank -1"), std::string::npos) << Error(s);
}

TEST_F(BadShard, ExpertIdsOutOfRangeOrRepeated) {
  ShardSpec s;
  s.experts = {0, 8};
  EXPECT_NE(Error(s).find("expert id 8"), std::string::npos) << Error(s);
  s.experts = {-1};
  EXPECT_NE(Error(s).find("expert id -1"), std::string::npos) << Error(s);
  s.experts = {2, 2};
  EXPECT_NE(Error(s).find("expert 2 listed twice"), std::string::npos) << Error(s);
}

TEST(LoadWeights, NullCheckpoint) {
  EXPECT_FALSE(LoadWeights(nullptr, ShardSpec{}).ok());
}

// ---- bad checkpoints ----------------------------------------------------------

// A valid tiny checkpoint whose model.safetensors is then rewritten by `edit`.
std::string EditedCheckpoint(const std::function<void(std::vector<Entry>&)>& edit) {
  std::string dir = MakeCheckpoint("ck", TinyConfig());
  std::vector<Entry> entries = ReadEntries(dir + "/model.safetensors");
  edit(entries);
  WriteSafetensors(dir + "/model.safetensors", entries);
  return dir;
}

// A valid tiny checkpoint whose config.json is then rewritten by `edit`.
std::string EditedConfig(const std::function<void(nlohmann::json&)>& edit) {
  std::string dir = MakeCheckpoint("ck", TinyConfig());
  nlohmann::json j;
  {
    std::ifstream in(dir + "/config.json");
    j = nlohmann::json::parse(in);
  }
  edit(j);
  std::ofstream(dir + "/config.json") << j.dump();
  return dir;
}

// The error of opening `dir` and loading all of it ("" when both succeed).
std::string LoadError(const std::string& dir) {
  auto ck = Checkpoint::Open(dir);
  if (!ck.ok()) return std::string(ck.status().message());
  auto w = LoadWeights(std::shared_ptr<const Checkpoint>(std::move(*ck)), ShardSpec{});
  return w.ok() ? "" : std::string(w.status().message());
}

Entry* FindEntry(std::vector<Entry>& entries, const std::string& name) {
  for (Entry& e : entries) {
    if (e.name == name) return &e;
  }
  ADD_FAILURE() << "no entry " << name;
  return &entries[0];
}

TEST(BadCheckpoint, MissingConfigField) {
  const std::string dir = EditedConfig([](nlohmann::json& j) { j.erase("head_dim"); });
  std::string err = LoadError(dir);
  EXPECT_NE(err.find("missing field 'head_dim'"), std::string::npos) << err;
}

TEST(BadCheckpoint, NoConfig) {
  std::string dir = MakeCheckpoint("ck", TinyConfig());
  std::filesystem::remove(dir + "/config.json");
  EXPECT_NE(LoadError(dir).find("no config.json"), std::string::npos) << LoadError(dir);
}

TEST(BadCheckpoint, NonMxfp4ConfigIsRejected) {
  const std::string dir = EditedConfig([](nlohmann::json& j) { j.erase("quantization_config"); });
  EXPECT_NE(LoadError(dir).find("MXFP4"), std::string::npos) << LoadError(dir);
}

TEST(BadCheckpoint, NoWeightFiles) {
  std::string dir = MakeCheckpoint("ck", TinyConfig());
  std::filesystem::remove(dir + "/model.safetensors");
  std::string err = LoadError(dir);
  EXPECT_NE(err.find("neither model.safetensors nor model.safetensors.index.json"),
            std::string::npos)
      << err;
}

TEST(BadCheckpoint, MissingTensor) {
  std::string dir = EditedCheckpoint([](std::vector<Entry>& e) {
    std::erase_if(e, [](const Entry& x) { return x.name == "model.layers.2.self_attn.k_proj.bias"; });
  });
  std::string err = LoadError(dir);
  EXPECT_NE(err.find("missing tensor 'model.layers.2.self_attn.k_proj.bias'"), std::string::npos)
      << err;
  EXPECT_NE(err.find("BF16 [32]"), std::string::npos) << err;
  auto ck = Checkpoint::Open(dir);
  ASSERT_TRUE(ck.ok());
  EXPECT_FALSE((*ck)->Validate().ok());
}

TEST(BadCheckpoint, MissingLmHeadOnlyMattersWhenLoaded) {
  std::string dir = EditedCheckpoint([](std::vector<Entry>& e) {
    std::erase_if(e, [](const Entry& x) { return x.name == "lm_head.weight"; });
  });
  EXPECT_NE(LoadError(dir).find("missing tensor 'lm_head.weight'"), std::string::npos);
  auto ck = Checkpoint::Open(dir);
  ASSERT_TRUE(ck.ok());
  ShardSpec s;
  s.load_lm_head = false;
  EXPECT_TRUE(LoadWeights(std::shared_ptr<const Checkpoint>(std::move(*ck)), s).ok());
}

// One tensor entry of the tiny checkpoint edited: the load names the
// tensor and what is wrong with it.
TEST(BadCheckpoint, EditedEntriesAreRefusedNamingTheProblem) {
  const struct {
    const char* what;
    std::function<void(std::vector<Entry>&)> edit;
    std::vector<std::string> problems;  // each must stand in the error
  } cases[] = {
      {"transposed",
       [](std::vector<Entry>& e) {
         FindEntry(e, "model.layers.1.self_attn.q_proj.weight")->shape = {64, 128};
       },
       {"'model.layers.1.self_attn.q_proj.weight' has shape [64, 128], expected [128, 64]"}},
      {"expert scales of another shape",
       [](std::vector<Entry>& e) {
         FindEntry(e, "model.layers.0.mlp.experts.down_proj_scales")->shape = {8, 128, 1};
       },
       {"down_proj_scales' has shape [8, 128, 1], expected [8, 64, 2]"}},
      {"wrong dtype",
       [](std::vector<Entry>& e) {
         FindEntry(e, "model.layers.3.mlp.router.weight")->dtype = "F16";
       },
       {"'model.layers.3.mlp.router.weight' has dtype F16, expected BF16"}},
      {"sinks in a dtype of BF16's size",
       [](std::vector<Entry>& e) { FindEntry(e, "model.layers.0.self_attn.sinks")->dtype = "I16"; },
       {"has dtype I16, expected BF16 or F32"}},
      {"a dtype no loader knows",
       [](std::vector<Entry>& e) { FindEntry(e, "model.norm.weight")->dtype = "F8_E5M2"; },
       {"unsupported dtype 'F8_E5M2'", "model.safetensors"}},
      {"BF16 data one byte off",
       [](std::vector<Entry>& e) {
         e.insert(e.begin(), Entry{"padding", "U8", {1}, {0}});
       },
       {"2-byte aligned"}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    const std::string err = LoadError(EditedCheckpoint(c.edit));
    for (const std::string& problem : c.problems) {
      EXPECT_NE(err.find(problem), std::string::npos) << err;
    }
  }
}

TEST(BadCheckpoint, TruncatedFile) {
  for (double keep : {0.5, 0.999}) {
    std::string dir = MakeCheckpoint("ck", TinyConfig());
    const std::string path = dir + "/model.safetensors";
    std::filesystem::resize_file(
        path, static_cast<uintmax_t>(static_cast<double>(std::filesystem::file_size(path)) * keep));
    std::string err = LoadError(dir);
    EXPECT_NE(err.find("truncated"), std::string::npos) << err;
  }
  std::string dir = MakeCheckpoint("ck", TinyConfig());
  std::filesystem::resize_file(dir + "/model.safetensors", 100);  // inside the header
  std::string err = LoadError(dir);
  EXPECT_NE(err.find("runs past the end of the file"), std::string::npos) << err;
}

TEST(BadCheckpoint, CorruptHeaderJson) {
  std::string dir = MakeCheckpoint("ck", TinyConfig());
  std::fstream f(dir + "/model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(8);
  f.write("!!", 2);
  f.close();
  std::string err = LoadError(dir);
  EXPECT_NE(err.find("not valid JSON"), std::string::npos) << err;
}

TEST(BadCheckpoint, ShardedIndexProblems) {
  ModelConfig c = TinyConfig();
  // A shard the index names is gone.
  std::string dir = MakeCheckpoint("a", c, 3);
  std::filesystem::remove(dir + "/model-00002-of-00003.safetensors");
  std::string err = LoadError(dir);
  EXPECT_NE(err.find("model-00002-of-00003.safetensors: cannot open"), std::string::npos) << err;

  // The index puts a tensor in a file that does not hold it.
  dir = MakeCheckpoint("b", c, 3);
  const std::string index = dir + "/model.safetensors.index.json";
  nlohmann::json j;
  {
    std::ifstream in(index);
    j = nlohmann::json::parse(in);
  }
  j["weight_map"]["lm_head.weight"] = "model-00001-of-00003.safetensors";
  std::ofstream(index) << j.dump();
  err = LoadError(dir);
  EXPECT_NE(err.find("puts 'lm_head.weight' in model-00001-of-00003.safetensors"), std::string::npos)
      << err;

  // The index is not JSON, lacks weight_map, or points outside the directory.
  std::ofstream(index) << "{not json";
  EXPECT_NE(LoadError(dir).find("not a valid JSON object"), std::string::npos);
  std::ofstream(index) << R"({"metadata":{}})";
  EXPECT_NE(LoadError(dir).find("missing object 'weight_map'"), std::string::npos);
  std::ofstream(index) << R"({"weight_map":{"lm_head.weight":"../x.safetensors"}})";
  EXPECT_NE(LoadError(dir).find("inside the checkpoint directory"), std::string::npos);
  std::ofstream(index) << R"({"weight_map":{"lm_head.weight":3}})";
  EXPECT_NE(LoadError(dir).find("is not a file name"), std::string::npos);
}

// ---- the committed golden fixtures ------------------------------------------

TEST(GoldenFixtures, OpenValidateAndMatchTheirGoldenJson) {
  for (const char* name : {"tiny_e8", "tiny_e16_sharded"}) {
    const std::string dir = std::string("tests/data/golden/") + name;
    auto ck = OpenOrDie(dir);
    ASSERT_NE(ck, nullptr) << name;
    EXPECT_TRUE(ck->Validate().ok()) << ck->Validate();
    auto w = LoadWeights(ck, ShardSpec{});
    ASSERT_TRUE(w.ok()) << w.status();
    std::ifstream in(dir + "/golden.json");
    nlohmann::json g = nlohmann::json::parse(in);
    EXPECT_EQ(g["vocab_size"], ck->config().vocab_size);
    ASSERT_EQ(g["prompts"].size(), g["logits_files"].size());
    ASSERT_EQ(g["prompts"].size(), g["greedy"].size());
    for (size_t i = 0; i < g["prompts"].size(); ++i) {
      const std::string file = dir + "/" + g["logits_files"][i].get<std::string>();
      EXPECT_EQ(std::filesystem::file_size(file),
                g["prompts"][i].size() * 4 * ck->config().vocab_size)
          << file;
      EXPECT_EQ(g["greedy"][i].size(), 24u);
    }
  }
}

}  // namespace
}  // namespace flotilla
