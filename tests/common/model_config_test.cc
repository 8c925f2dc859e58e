#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "common/model_config.h"

namespace flotilla {
namespace {

using nlohmann::json;

TEST(ModelConfig, RoundTripsThroughJson) {
  for (const ModelConfig& c :
       {ModelConfig::Gptoss120b(), ModelConfig::Gptoss20b(), ModelConfig::Tiny()}) {
    absl::StatusOr<ModelConfig> back = ModelConfig::FromJson(c.ToJson());
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->ToJson(), c.ToJson());
    EXPECT_EQ(back->layer_types, c.layer_types);
  }
}

TEST(ModelConfig, ReadsPublishedShape) {
  json j = ModelConfig::Gptoss120b().ToJson();
  absl::StatusOr<ModelConfig> c = ModelConfig::FromJson(j);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->num_local_experts, 128);
  EXPECT_EQ(c->rope_scaling.factor, 32.0);
  EXPECT_TRUE(c->is_sliding(0));
  EXPECT_FALSE(c->is_sliding(1));
  EXPECT_EQ(c->eos_token_ids, std::vector<int>{200002});
}

TEST(ModelConfig, AcceptsRopeParametersOfNewerTransformers) {
  json j = ModelConfig::Tiny().ToJson();
  j.erase("rope_scaling");
  j.erase("rope_theta");
  j["rope_parameters"] = {{"rope_type", "yarn"}, {"factor", 8.0}, {"rope_theta", 1000.0},
                          {"original_max_position_embeddings", 256}};
  absl::StatusOr<ModelConfig> c = ModelConfig::FromJson(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope_theta, 1000.0);
  EXPECT_EQ(c->rope_scaling.factor, 8.0);
  EXPECT_EQ(c->rope_scaling.original_max_position_embeddings, 256);
}

TEST(ModelConfig, MissingFieldIsNamed) {
  json j = ModelConfig::Tiny().ToJson();
  j.erase("head_dim");
  absl::StatusOr<ModelConfig> c = ModelConfig::FromJson(j);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("'head_dim'"), std::string::npos) << c.status();
}

TEST(ModelConfig, WrongTypesAndInconsistenciesAreRejected) {
  json j = ModelConfig::Tiny().ToJson();
  j["hidden_size"] = "big";
  EXPECT_NE(ModelConfig::FromJson(j).status().message().find("hidden_size"), std::string::npos);

  j = ModelConfig::Tiny().ToJson();
  j["layer_types"].push_back("full_attention");
  EXPECT_NE(ModelConfig::FromJson(j).status().message().find("layer_types"), std::string::npos);

  j = ModelConfig::Tiny().ToJson();
  j["num_key_value_heads"] = 3;
  EXPECT_FALSE(ModelConfig::FromJson(j).ok());

  j = ModelConfig::Tiny().ToJson();
  j["quantization_config"]["quant_method"] = "gptq";
  EXPECT_NE(ModelConfig::FromJson(j).status().message().find("quant_method"), std::string::npos);

  EXPECT_FALSE(ModelConfig::FromJson(json::array()).ok());
}

// A field of the wrong type is named by its type when it is an array or an
// object: dumping it recursed once per nesting level (a stack overflow on a
// crafted config.json).
TEST(ModelConfig, DeeplyNestedWrongFieldIsAnErrorNotACrash) {
  const size_t depth = 1000000;
  json j = ModelConfig::Tiny().ToJson();
  j["hidden_size"] = json::parse(std::string(depth, '[') + std::string(depth, ']'));
  absl::Status st = ModelConfig::FromJson(j).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("hidden_size"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("got array"), std::string::npos) << st.message();
}

TEST(ModelConfig, LoadReportsMissingFile) {
  absl::StatusOr<ModelConfig> c = ModelConfig::Load("/nonexistent-dir");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace flotilla
