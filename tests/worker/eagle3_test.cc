// EAGLE3 drafting's parts: the head loader on the published layout and on
// broken directories (worker/model/eagle3_head.h), synthetic:eagle3
// (eagle3_synthetic.h), the CPU engine's hidden states, and the drafter's
// bookkeeping (eagle3_drafter.h). The serving runs with speculation on and
// off are in speculative_test.cc.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

#include "common/bf16.h"
#include "kernels/cpu/ops.h"
#include "tests/model/test_util.h"
#include "worker/draft_head.h"
#include "worker/eagle3_drafter.h"
#include "worker/engine/cpu_engine.h"
#include "worker/model/eagle3_head.h"
#include "worker/model/eagle3_synthetic.h"
#include "worker/model/model_source.h"
#include "worker/model/synthetic_weights.h"
#include "worker/speculation.h"

namespace flotilla::worker {
namespace {

using testing_util::Entry;
using testing_util::ReadEntries;
using testing_util::ScratchDir;

ModelConfig Target() {
  ModelConfig c = ModelConfig::Tiny();
  c.vocab_size = 201088;  // o200k's: the published heads' draft vocabulary of 32,000 fits
  return c;
}

void ExpectRefused(const absl::StatusOr<std::unique_ptr<Eagle3Head>>& got,
                   const std::string& says) {
  ASSERT_FALSE(got.ok());
  EXPECT_NE(got.status().message().find(says), std::string::npos) << got.status();
}

// A copy of the synthetic head in `dir` with `edit` applied to its tensors.
std::string EditedHead(const std::string& name,
                       const std::function<void(std::vector<Entry>&)>& edit) {
  const std::string from = ScratchDir("from_" + name), to = ScratchDir(name);
  EXPECT_TRUE(WriteSyntheticEagle3Head(from, Target(), 1).ok());
  std::vector<Entry> entries = ReadEntries(from + "/model.safetensors");
  edit(entries);
  testing_util::WriteSafetensors(to + "/model.safetensors", entries);
  std::filesystem::copy_file(from + "/config.json", to + "/config.json");
  return to;
}

std::string EditedConfig(const std::string& name,
                         const std::function<void(nlohmann::json&)>& edit) {
  const std::string dir = ScratchDir(name);
  EXPECT_TRUE(WriteSyntheticEagle3Head(dir, Target(), 1).ok());
  std::ifstream in(dir + "/config.json");
  nlohmann::json j = nlohmann::json::parse(in);
  edit(j);
  std::ofstream(dir + "/config.json", std::ios::trunc) << j.dump();
  return dir;
}

TEST(Eagle3HeadTest, TheSyntheticHeadIsWrittenInThePublishedLayout) {
  const std::string dir = ScratchDir("head");
  ASSERT_TRUE(WriteSyntheticEagle3Head(dir, Target(), 3).ok());
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const Entry& e : ReadEntries(dir + "/model.safetensors")) shapes[e.name] = e.shape;
  const int64_t H = 64;
  EXPECT_EQ(shapes["fc.weight"], (std::vector<int64_t>{H, 3 * H}));
  EXPECT_EQ(shapes["midlayer.self_attn.q_proj.weight"], (std::vector<int64_t>{8 * 16, 2 * H}));
  EXPECT_EQ(shapes["midlayer.self_attn.k_proj.weight"], (std::vector<int64_t>{2 * 16, 2 * H}));
  EXPECT_EQ(shapes["midlayer.mlp.down_proj.weight"], (std::vector<int64_t>{H, 6 * H}));
  EXPECT_EQ(shapes["lm_head.weight"], (std::vector<int64_t>{32000, H}));
  EXPECT_EQ(shapes["d2t"], (std::vector<int64_t>{32000}));
  EXPECT_EQ(shapes["t2d"], (std::vector<int64_t>{201088}));
  EXPECT_EQ(shapes.count("embed_tokens.weight"), 0u);  // the target's is used

  absl::StatusOr<std::unique_ptr<Eagle3Head>> head = LoadEagle3Head(dir, Target());
  ASSERT_TRUE(head.ok()) << head.status();
  const Eagle3Config& c = (*head)->config;
  EXPECT_EQ(c.aux_layers, (std::vector<int>{0, 1, 3}));
  EXPECT_EQ(c.draft_vocab_size, 32000);
  EXPECT_FALSE((*head)->has_embedding());
  // Draft ids map to distinct target ids, in order.
  for (int64_t d = 1; d < c.draft_vocab_size; ++d) {
    ASSERT_LT((*head)->draft_to_target[d - 1], (*head)->draft_to_target[d]);
  }
  EXPECT_LT((*head)->draft_to_target.back(), 201088);
  // The same spec gives the same weights (the cache directory's or a fresh write).
  const std::string again = ScratchDir("again");
  ASSERT_TRUE(WriteSyntheticEagle3Head(again, Target(), 3).ok());
  EXPECT_EQ((*LoadEagle3Head(again, Target()))->fc, (*head)->fc);
}

TEST(Eagle3HeadTest, ThePublishedGptOss120bShapes) {
  // config.json of the published gpt-oss-120b heads (the keys they set).
  const std::string published = R"({
    "architectures": ["LlamaForCausalLMEagle3"],
    "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 17, 33]},
    "head_dim": 64, "hidden_act": "silu", "hidden_size": 2880, "intermediate_size": 17280,
    "max_position_embeddings": 4096, "model_type": "llama", "num_attention_heads": 64,
    "num_key_value_heads": 8, "num_hidden_layers": 1, "rms_norm_eps": 1e-05,
    "tie_word_embeddings": false, "torch_dtype": "bfloat16", "vocab_size": 201088,
    "draft_vocab_size": 32000})";
  absl::StatusOr<Eagle3Config> c = ParseEagle3Config(published, ModelConfig::Gptoss120b());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->aux_layers, (std::vector<int>{1, 17, 33}));
  EXPECT_EQ(c->target_hidden_size, 2880);
  EXPECT_EQ(c->draft_vocab_size, 32000);
  EXPECT_DOUBLE_EQ(c->rope_theta, 10000.0);
  // gpt-oss-20b has 24 layers: layer 33 is not there.
  absl::StatusOr<Eagle3Config> wrong = ParseEagle3Config(published, ModelConfig::Gptoss20b());
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find("layer 33"), std::string::npos) << wrong.status();
  // The synthetic head for 120b has the same shapes.
  EXPECT_EQ(DefaultEagle3AuxLayers(36), (std::vector<int>{1, 17, 32}));
}

TEST(Eagle3HeadTest, RefusesAHeadThatDoesNotFitTheTarget) {
  const std::string dir = ScratchDir("head");
  ASSERT_TRUE(WriteSyntheticEagle3Head(dir, Target(), 1).ok());
  ModelConfig other_vocab = Target();
  other_vocab.vocab_size = 1024;
  ExpectRefused(LoadEagle3Head(dir, other_vocab), "vocab_size 201088 is not the target's 1024");
  ModelConfig other_hidden = Target();
  other_hidden.hidden_size = 128;
  ExpectRefused(LoadEagle3Head(dir, other_hidden), "the target's hidden size is 128");
  ModelConfig fewer_layers = Target();
  fewer_layers.num_hidden_layers = 2;
  ExpectRefused(LoadEagle3Head(dir, fewer_layers), "names layer 3");
}

TEST(Eagle3HeadTest, RefusesAMalformedDirectory) {
  const ModelConfig t = Target();
  ExpectRefused(LoadEagle3Head(ScratchDir("empty"), t), "no config.json");
  {
    const std::string dir = ScratchDir("pickles");
    ASSERT_TRUE(WriteSyntheticEagle3Head(dir, t, 1).ok());
    std::filesystem::rename(dir + "/model.safetensors", dir + "/pytorch_model.bin");
    ExpectRefused(LoadEagle3Head(dir, t), "convert them to safetensors");
  }
  ExpectRefused(LoadEagle3Head(EditedConfig("not_eagle",
                                            [](nlohmann::json& j) {
                                              j["architectures"] = {"LlamaForCausalLM"};
                                            }),
                               t),
                "names no EAGLE3 head");
  ExpectRefused(
      LoadEagle3Head(EditedConfig("no_hidden", [](nlohmann::json& j) { j.erase("hidden_size"); }),
                     t),
      "missing key 'hidden_size'");
  ExpectRefused(
      LoadEagle3Head(
          EditedConfig("two_layers", [](nlohmann::json& j) { j["num_hidden_layers"] = 2; }), t),
      "one decoder layer");
  auto drop = [](const std::string& name) {
    return [name](std::vector<Entry>& e) {
      e.erase(std::remove_if(e.begin(), e.end(), [&](const Entry& x) { return x.name == name; }),
              e.end());
    };
  };
  ExpectRefused(LoadEagle3Head(EditedHead("no_lm_head", drop("lm_head.weight")), t),
                "tensor lm_head.weight is missing");
  ExpectRefused(LoadEagle3Head(EditedHead("no_d2t", drop("d2t")), t), "tensor d2t is missing");
  ExpectRefused(LoadEagle3Head(EditedHead("short_fc",
                                          [](std::vector<Entry>& e) {
                                            for (Entry& x : e) {
                                              if (x.name != "fc.weight") continue;
                                              x.shape = {64, 128};
                                              x.bytes.resize(64 * 128 * 2);
                                            }
                                          }),
                               t),
                "fc.weight is [64, 128]; the config implies [64, 192]");
  ExpectRefused(LoadEagle3Head(EditedHead("extra",
                                          [](std::vector<Entry>& e) {
                                            e.push_back({"midlayer.self_attn.q_proj.bias",
                                                         "BF16",
                                                         {128},
                                                         std::vector<uint8_t>(256)});
                                          }),
                               t),
                "tensors this loader does not know: midlayer.self_attn.q_proj.bias");
  ExpectRefused(LoadEagle3Head(EditedHead("far_d2t",
                                          [](std::vector<Entry>& e) {
                                            for (Entry& x : e) {
                                              if (x.name != "d2t") continue;
                                              const int64_t big = 300000;
                                              std::memcpy(x.bytes.data(), &big, 8);
                                            }
                                          }),
                               t),
                "d2t maps draft id 0 to 300000");
}

// The names some trainers save: "model." before everything but lm_head and
// "layers.0." for the decoder layer; F32 tensors are rounded to bf16.
TEST(Eagle3HeadTest, ReadsTheModelPrefixedLayoutAndF32) {
  const std::string dir = EditedHead("prefixed", [](std::vector<Entry>& entries) {
    for (Entry& e : entries) {
      if (e.name.rfind("midlayer.", 0) == 0) e.name = "model.layers.0." + e.name.substr(9);
      if (e.name == "fc.weight" || e.name == "norm.weight") e.name = "model." + e.name;
      if (e.name == "model.norm.weight") {  // as F32
        std::vector<uint8_t> f32(e.bytes.size() * 2);
        for (size_t i = 0; i < e.bytes.size() / 2; ++i) {
          const float v =
              Bf16ToFloat(static_cast<uint16_t>(e.bytes[2 * i] | e.bytes[2 * i + 1] << 8));
          std::memcpy(&f32[4 * i], &v, 4);
        }
        e.bytes = f32;
        e.dtype = "F32";
      }
    }
  });
  const std::string plain = ScratchDir("plain");
  ASSERT_TRUE(WriteSyntheticEagle3Head(plain, Target(), 1).ok());
  absl::StatusOr<std::unique_ptr<Eagle3Head>> a = LoadEagle3Head(dir, Target());
  absl::StatusOr<std::unique_ptr<Eagle3Head>> b = LoadEagle3Head(plain, Target());
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ((*a)->q_proj, (*b)->q_proj);
  EXPECT_EQ((*a)->final_norm, (*b)->final_norm);
  EXPECT_EQ((*a)->fc, (*b)->fc);
}

TEST(Eagle3HeadTest, SyntheticSpecsResolveToACachedDirectory) {
  setenv("XDG_CACHE_HOME", ScratchDir("cache").c_str(), 1);
  absl::StatusOr<std::string> dir = Eagle3HeadDir("synthetic:eagle3:5", Target());
  ASSERT_TRUE(dir.ok()) << dir.status();
  EXPECT_TRUE(std::filesystem::exists(*dir + "/config.json"));
  EXPECT_EQ(*Eagle3HeadDir("synthetic:eagle3:5", Target()), *dir);
  EXPECT_NE(*Eagle3HeadDir("synthetic:eagle3", Target()), *dir);
  EXPECT_EQ(*Eagle3HeadDir("/some/dir", Target()), "/some/dir");
  EXPECT_FALSE(Eagle3HeadDir("synthetic:eagle3:x", Target()).ok());
  // The worker's loading: a synthetic target's embedding is generated when
  // the shard is not in host memory.
  absl::StatusOr<std::unique_ptr<ModelSource>> model = ModelSource::Open("synthetic:tiny");
  ASSERT_TRUE(model.ok()) << model.status();
  absl::StatusOr<std::shared_ptr<const Eagle3Head>> head =
      LoadDraftHead("synthetic:eagle3", **model, ModelWeights{});
  ASSERT_TRUE(head.ok()) << head.status();
  EXPECT_TRUE((*head)->has_embedding());
  EXPECT_EQ((*head)->embedding.rows, (*model)->config().vocab_size);
  absl::StatusOr<std::shared_ptr<const Eagle3Head>> missing =
      LoadDraftHead(ScratchDir("nothing"), **model, ModelWeights{});
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("--speculative-model "), std::string::npos);
  unsetenv("XDG_CACHE_HOME");
}

TEST(SpeculativeSettingsTest, Eagle3IsAMethod) {
  EXPECT_EQ(*ParseSpeculativeMethod("eagle3"), SpeculativeMethod::kEagle3);
  EXPECT_EQ(SpeculativeMethodName(SpeculativeMethod::kEagle3), "eagle3");
}

// ---- the engine's hidden states ----

// The state after the last layer, through the final norm and lm_head, gives
// the step's logits: the captured rows are the residual stream after the
// named layers, at every position; other items get none.
TEST(CpuEngineHiddenTest, ReturnsTheResidualStreamAfterTheCapturedLayers) {
  const ModelConfig c = ModelConfig::Tiny();
  absl::StatusOr<ModelWeights> w = MakeSyntheticWeights(c, 2, ShardSpec{});
  ASSERT_TRUE(w.ok()) << w.status();
  const ModelWeights weights = *w;
  CpuEngineOptions eo;
  eo.kv_num_blocks = 64;
  std::unique_ptr<CpuEngine> engine = *CpuEngine::Create(*std::move(w), eo, nullptr);
  const int64_t a = engine->NewSequence(), b = engine->NewSequence();
  StepItem item{a, {5, 9, 14, 3}, LogitsMode::kAll};
  item.return_hidden = true;
  EXPECT_FALSE(engine->Validate({item}).ok());  // nothing captured yet
  EXPECT_FALSE(engine->SetHiddenCapture({0, 4}).ok());
  ASSERT_TRUE(engine->SetHiddenCapture({1, 3}).ok());
  absl::StatusOr<StepOutput> out = engine->Step({item, StepItem{b, {7, 8}, LogitsMode::kNone}});
  ASSERT_TRUE(out.ok()) << out.status();
  const int64_t H = c.hidden_size, V = c.vocab_size;
  ASSERT_EQ(out->hidden[0].size(), static_cast<size_t>(4 * 2 * H));
  EXPECT_TRUE(out->hidden[1].empty());
  std::vector<float> normed(H), logits(V);
  for (int64_t j = 0; j < 4; ++j) {
    const float* last = &out->hidden[0][(j * 2 + 1) * H];
    kernels::cpu::RmsNorm(last, weights.final_norm.data, 1, H, static_cast<float>(c.rms_norm_eps),
                          normed.data());
    kernels::cpu::LinearBf16(nullptr, normed.data(), 1, H, weights.lm_head.data,
                             weights.lm_head.row_stride, V, nullptr, logits.data());
    for (int64_t v = 0; v < V; v += 97) {
      ASSERT_NEAR(logits[v], out->logits[0][j * V + v], 1e-4) << "position " << j;
    }
  }
}

// ---- the drafter ----

std::shared_ptr<Eagle3Head> TinyHead() {
  const ModelConfig t = ModelConfig::Tiny();
  const std::string dir = ScratchDir("tiny_head");
  EXPECT_TRUE(WriteSyntheticEagle3Head(dir, t, 11).ok());
  absl::StatusOr<std::unique_ptr<Eagle3Head>> head = LoadEagle3Head(dir, t);
  EXPECT_TRUE(head.ok()) << head.status();
  static const ModelWeights weights = *MakeSyntheticWeights(t, 2, ShardSpec{});
  std::shared_ptr<Eagle3Head> shared = *std::move(head);
  EXPECT_TRUE(shared->UseTargetEmbedding(weights.embed, weights.keepalive).ok());
  return shared;
}

// States given step by step, with drafts proposed (and dropped) between,
// leave the drafter where states given at once do: only committed
// positions stay in the head's attention.
TEST(Eagle3DrafterTest, StepByStepEqualsAllAtOnce) {
  std::shared_ptr<Eagle3Head> head = TinyHead();
  const int64_t width = 3 * 64;
  std::mt19937 gen(4);
  std::normal_distribution<float> normal;
  std::uniform_int_distribution<int32_t> token(0, 1023);
  const int64_t n = 24;
  std::vector<float> states(n * width);
  for (float& v : states) v = normal(gen);
  std::vector<int32_t> tokens(n + 1);
  for (int32_t& t : tokens) t = token(gen);

  Eagle3Drafter gap(head.get(), nullptr);
  gap.AddHidden(0, states.data(), 5);
  EXPECT_TRUE(gap.Propose(absl::MakeConstSpan(tokens).first(11), 3).empty())
      << "without the state of position 9 there is nothing to draft from";

  Eagle3Drafter stepwise(head.get(), nullptr);
  stepwise.AddHidden(0, states.data(), 10);  // a prompt of 10, then its first token
  std::vector<int32_t> draft = stepwise.Propose(absl::MakeConstSpan(tokens).first(11), 3);
  EXPECT_EQ(draft.size(), 3u);
  for (int64_t p = 10; p < n; p += 2) {  // steps that accept one drafted token
    stepwise.AddHidden(p, &states[p * width], 2);
    draft = stepwise.Propose(absl::MakeConstSpan(tokens).first(p + 3), 4);
  }
  Eagle3Drafter at_once(head.get(), nullptr);
  at_once.AddHidden(0, states.data(), n);
  EXPECT_EQ(at_once.Propose(absl::MakeConstSpan(tokens).first(n + 1), 4), draft);
  EXPECT_EQ(stepwise.committed(), n);
  EXPECT_EQ(at_once.committed(), n);
  for (int32_t t : draft) {
    EXPECT_GE(t, 0);
    EXPECT_LT(t, 1024);
  }
}

}  // namespace
}  // namespace flotilla::worker
