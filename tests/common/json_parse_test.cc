// ParseJson: nesting bounded while parsing, so a deep body is refused before
// anything could recurse into it, and ordinary JSON parses as nlohmann's own
// parser would.
#include "common/json_parse.h"

#include <gtest/gtest.h>

#include <string>

#include "common/sampling_check.h"

namespace flotilla {
namespace {

std::string Arrays(int depth) { return std::string(depth, '[') + std::string(depth, ']'); }

std::string Objects(int depth) {
  std::string s;
  for (int i = 0; i < depth; ++i) s += "{\"a\":";
  s += "1";
  return s + std::string(depth, '}');
}

TEST(JsonParseTest, ParsesOrdinaryJsonAsNlohmannDoes) {
  const std::string text =
      R"({"model": "m", "messages": [{"role": "user", "content": "h\u00e9"}], "n": 2, "x": 1.5e3,
          "ok": true, "none": null, "big": 18446744073709551615, "neg": -3})";
  absl::StatusOr<nlohmann::json> got = ParseJson(text, "body");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, nlohmann::json::parse(text));
  absl::StatusOr<nlohmann::ordered_json> ordered = ParseJson<nlohmann::ordered_json>(text, "body");
  ASSERT_TRUE(ordered.ok());
  EXPECT_EQ(ordered->begin().key(), "model");  // order kept
  EXPECT_EQ(ordered->dump(), nlohmann::ordered_json::parse(text).dump());
}

TEST(JsonParseTest, AcceptsTheLimitAndRefusesOneLevelMore) {
  for (const auto& make : {Arrays, Objects}) {
    absl::StatusOr<nlohmann::json> at = ParseJson(make(kMaxJsonDepth), "body");
    EXPECT_TRUE(at.ok()) << at.status();
    absl::StatusOr<nlohmann::json> over = ParseJson(make(kMaxJsonDepth + 1), "body");
    ASSERT_FALSE(over.ok());
    EXPECT_EQ(over.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(over.status().message(), "body is nested more than 64 levels deep");
  }
  EXPECT_TRUE(ParseJson(Arrays(3), "x", /*max_depth=*/3).ok());
  EXPECT_FALSE(ParseJson(Arrays(4), "x", /*max_depth=*/3).ok());
}

TEST(JsonParseTest, RefusesHundredsOfThousandsOfLevelsWithoutRecursing) {
  // The probe's body: about 100 KB of '[' crashed the coordinator. Closed or
  // not, such a body is refused at level 65, before a deeper value exists.
  for (const std::string& body :
       {Arrays(500000), std::string(1 << 20, '['), "{\"metadata\": " + Objects(100000) + "}"}) {
    absl::StatusOr<nlohmann::ordered_json> got = ParseJson<nlohmann::ordered_json>(body, "body");
    ASSERT_FALSE(got.ok());
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(got.status().message().find("nested more than"), std::string::npos);
  }
}

TEST(JsonParseTest, NamesWhatIsNotJsonAndWhere) {
  absl::StatusOr<nlohmann::json> got = ParseJson("{\"a\": [1, 2,]}", "the schema");
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(got.status().message(), "the schema is not valid JSON (byte 13)");
  EXPECT_FALSE(ParseJson("", "x").ok());
  EXPECT_FALSE(ParseJson("{} {}", "x").ok());  // one value only
  EXPECT_FALSE(ParseJson("\"\xff\"", "x").ok());
}

TEST(SamplingCheckTest, NamesTheFirstFieldOutOfRange) {
  common::SamplingParams s;
  EXPECT_TRUE(CheckSamplingParams(s, 1000).ok());
  s.set_temperature(-1);
  EXPECT_EQ(CheckSamplingParams(s, 1000).message(), "sampling.temperature: must be in [0, 2], not -1");
  s.set_temperature(0.7f);
  s.set_top_p(7);
  EXPECT_EQ(CheckSamplingParams(s, 1000).message(), "sampling.top_p: must be in (0, 1], not 7");
  s.set_top_p(0);
  EXPECT_FALSE(CheckSamplingParams(s, 1000).ok());
  s.set_top_p(1);
  s.set_min_p(std::nanf(""));
  EXPECT_NE(CheckSamplingParams(s, 1000).message().find("sampling.min_p"), std::string::npos);
  s.set_min_p(0);
  (*s.mutable_logit_bias())[1000] = 1;
  EXPECT_NE(CheckSamplingParams(s, 1000).message().find("outside the vocabulary"), std::string::npos);
  s.clear_logit_bias();
  (*s.mutable_logit_bias())[5] = 101;
  EXPECT_FALSE(CheckSamplingParams(s, 1000).ok());
  s.clear_logit_bias();
  s.add_stop_token_ids(-2);
  EXPECT_EQ(CheckSamplingParams(s, 1000).code(), absl::StatusCode::kInvalidArgument);
  s.clear_stop_token_ids();
  s.set_logprobs(21);
  EXPECT_FALSE(CheckSamplingParams(s, 1000).ok());
  s.set_logprobs(20);
  s.set_repetition_penalty(0);
  EXPECT_FALSE(CheckSamplingParams(s, 1000).ok());
  s.set_repetition_penalty(2);
  EXPECT_TRUE(CheckSamplingParams(s, 1000).ok());
}

}  // namespace
}  // namespace flotilla
