// The Harmony turn constraint over the real o200k vocabulary, driven by a
// "model" that picks uniformly among the allowed tokens: every turn ends with
// the right end token, and its final message (or tool call) is JSON that
// conforms.
#include <gtest/gtest.h>

#include <random>
#include <regex>

#include "common/grammar/o200k_vocabulary.h"
#include "common/grammar/output_constraint.h"
#include "tests/common/grammar_test_util.h"

namespace flotilla::grammar {
namespace {

using Json = nlohmann::json;

using testing_util::O200kIndex;

struct Turn {
  std::string text;  // bytes, special tokens as their names
  int32_t last = -1;
  int tokens = 0;
  bool complete = false;  // the constraint ended the turn
};

Turn Drive(OutputConstraint& c, std::mt19937& rng, int max_tokens) {
  const TokenVocabulary& v = O200kIndex()->vocab();
  Turn turn;
  for (; turn.tokens < max_tokens && !c.complete(); ++turn.tokens) {
    const uint32_t* mask = c.Mask();
    std::vector<int32_t> allowed;
    for (int32_t t = 0; t < v.vocab_size; ++t) {
      if (TestBit(mask, t)) allowed.push_back(t);
    }
    EXPECT_FALSE(allowed.empty()) << turn.text;
    if (allowed.empty()) break;
    const int32_t t = allowed[rng() % allowed.size()];
    EXPECT_TRUE(c.Advance(t).ok());
    turn.last = t;
    if (v.bytes[t].empty()) {
      turn.text += t == v.channel ? "<|channel|>" : t == v.message ? "<|message|>"
                 : t == v.end ? "<|end|>" : t == v.start ? "<|start|>"
                 : t == v.constrain ? "<|constrain|>" : t == v.call ? "<|call|>" : "<|return|>";
    } else {
      turn.text += v.bytes[t];
    }
  }
  return turn;
}

// A turn of random allowed tokens under a fresh constraint of `spec`.
Turn RandomTurn(const ConstraintSpec& spec, std::mt19937& rng, int max_tokens) {
  auto c = OutputConstraint::Create(spec, O200kIndex());
  EXPECT_TRUE(c.ok()) << c.status();
  if (!c.ok()) return {};
  Turn turn = Drive(**c, rng, max_tokens);
  turn.complete = (*c)->complete();
  return turn;
}

std::string After(const std::string& text, const std::string& marker, const std::string& end) {
  const size_t at = text.rfind(marker);
  if (at == std::string::npos) return "";
  const size_t from = at + marker.size();
  const size_t to = text.find(end, from);
  return text.substr(from, to == std::string::npos ? std::string::npos : to - from);
}

TEST(GrammarConstraint, FinalJsonAfterFreeReasoning) {
  ASSERT_NE(O200kIndex(), nullptr);
  ConstraintSpec spec;
  spec.json_final = true;
  spec.final_schema = R"({"type": "object", "properties": {
      "city": {"type": "string", "maxLength": 12}, "temp": {"type": "number", "minimum": -50, "maximum": 60},
      "sky": {"enum": ["clear", "cloudy"]}}, "required": ["city", "temp", "sky"], "additionalProperties": false})";
  spec.reasoning_budget = 8;
  std::mt19937 rng(3);
  for (int run = 0; run < 6; ++run) {
    const Turn turn = RandomTurn(spec, rng, 400);
    ASSERT_TRUE(turn.complete) << turn.text;
    EXPECT_EQ(turn.last, O200kIndex()->vocab().return_);
    const std::string json = After(turn.text, "<|channel|>final<|message|>", "<|return|>");
    const Json v = Json::parse(json, nullptr, false);
    ASSERT_FALSE(v.is_discarded()) << turn.text;
    EXPECT_TRUE(v["temp"].get<double>() >= -50 && v["temp"].get<double>() <= 60) << json;
    EXPECT_TRUE(v["sky"] == "clear" || v["sky"] == "cloudy") << json;
    EXPECT_LE(v["city"].get<std::string>().size(), 12 * 4u) << json;
  }
}

TEST(GrammarConstraint, RequiredToolCall) {
  ASSERT_NE(O200kIndex(), nullptr);
  ConstraintSpec spec;
  spec.tool_required = true;
  spec.tools.push_back({"get_weather", R"({"type": "object", "properties": {
      "location": {"type": "string", "maxLength": 10}, "unit": {"enum": ["c", "f"]}},
      "required": ["location", "unit"], "additionalProperties": false})", true});
  spec.tools.push_back({"get_time", R"({"type": "object", "properties": {
      "zone": {"type": "integer", "minimum": -12, "maximum": 14}}, "required": ["zone"]})", true});
  std::mt19937 rng(5);
  for (int run = 0; run < 6; ++run) {
    const Turn turn = RandomTurn(spec, rng, 300);
    ASSERT_TRUE(turn.complete) << turn.text;
    EXPECT_EQ(turn.last, O200kIndex()->vocab().call);
    EXPECT_EQ(turn.text.find("<|channel|>final"), std::string::npos);
    const std::string args = After(turn.text, "json<|message|>", "<|call|>");
    const Json v = Json::parse(args, nullptr, false);
    ASSERT_FALSE(v.is_discarded()) << turn.text;
    if (turn.text.find("to=functions.get_weather<|constrain|>") != std::string::npos) {
      EXPECT_TRUE(v.contains("location") && (v["unit"] == "c" || v["unit"] == "f")) << args;
    } else {
      ASSERT_NE(turn.text.find("to=functions.get_time<|constrain|>"), std::string::npos) << turn.text;
      EXPECT_TRUE(v["zone"].get<int>() >= -12 && v["zone"].get<int>() <= 14) << args;
    }
  }
}

TEST(GrammarConstraint, RefusesATokenOutsideTheMask) {
  ASSERT_NE(O200kIndex(), nullptr);
  ConstraintSpec spec;
  spec.json_final = true;
  auto c = OutputConstraint::Create(spec, O200kIndex());
  ASSERT_TRUE(c.ok());
  // The turn must open with <|channel|>: ordinary text is refused.
  EXPECT_FALSE((*c)->Advance(24912).ok());
}

TEST(GrammarConstraint, UnsupportedSchemaIsRefused) {
  ConstraintSpec spec;
  spec.json_final = true;
  spec.final_schema = R"({"type": "string", "pattern": "(a)\\1"})";
  absl::Status st = CheckSpec(spec);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(st.message()).find("pattern"), std::string::npos) << st;
}

// Formats and patterns over the real vocabulary: the masks only let through
// tokens that keep the decoded value matching (multi-character tokens, and
// tokens that end in a quote or run past it, included), so every turn's JSON
// holds values that checks written here independently accept.
TEST(GrammarConstraint, FormatsAndPatternsHoldTokenByToken) {
  ASSERT_NE(O200kIndex(), nullptr);
  ConstraintSpec spec;
  spec.json_final = true;
  spec.final_schema = R"({"type": "object", "properties": {
      "id": {"type": "string", "format": "uuid"},
      "mail": {"type": "string", "format": "email", "maxLength": 24},
      "day": {"type": "string", "format": "date"},
      "code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"}},
      "required": ["id", "mail", "day", "code"], "additionalProperties": false})";
  const std::regex uuid("^[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}$");
  const std::regex mail("^[^@\\s.]+(\\.[^@\\s.]+)*@([A-Za-z0-9-]+\\.)+[A-Za-z]{2,}$");
  const std::regex day("^[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])$");
  const std::regex code("^[A-Z]{3}-[0-9]{2}$");
  std::mt19937 rng(9);
  for (int run = 0; run < 4; ++run) {
    const Turn turn = RandomTurn(spec, rng, 400);
    ASSERT_TRUE(turn.complete) << turn.text;
    const std::string json = After(turn.text, "<|channel|>final<|message|>", "<|return|>");
    const Json v = Json::parse(json, nullptr, false);
    ASSERT_TRUE(v.is_object()) << json;
    EXPECT_TRUE(std::regex_match(v["id"].get<std::string>(), uuid)) << json;
    EXPECT_TRUE(std::regex_match(v["mail"].get<std::string>(), mail)) << json;
    EXPECT_LE(v["mail"].get<std::string>().size(), 24u) << json;
    EXPECT_TRUE(std::regex_match(v["day"].get<std::string>(), day)) << json;
    EXPECT_TRUE(std::regex_match(v["code"].get<std::string>(), code)) << json;
  }
}

}  // namespace
}  // namespace flotilla::grammar
