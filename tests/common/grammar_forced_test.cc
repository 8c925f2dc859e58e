// OutputConstraint::Forced and AcceptedPrefix over the real o200k
// vocabulary: the text the grammar leaves no choice about (a header with one
// form left, JSON punctuation, required keys, an enum with one value left,
// the end token after a whole document), nothing where the content is free,
// and no change to the constraint's state.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "common/grammar/output_constraint.h"
#include "common/tokenizer/tokenizer.h"
#include "tests/common/grammar_test_util.h"

namespace flotilla::grammar {
namespace {

using testing_util::O200kIndex;

// The forced pieces as text, special tokens as <id>.
std::string Text(const std::vector<ForcedPiece>& pieces) {
  std::string out;
  for (const ForcedPiece& p : pieces) {
    out += p.special >= 0 ? "<" + std::to_string(p.special) + ">" : p.bytes;
  }
  return out;
}

std::string Special(tokenizer::TokenId id) { return "<" + std::to_string(id) + ">"; }

// The o200k token whose bytes are `text` (the test's choice of token).
int32_t TokenOf(const std::string& text) {
  const TokenVocabulary& v = O200kIndex()->vocab();
  for (int32_t t = 0; t < v.vocab_size; ++t) {
    if (v.bytes[t] == text) return t;
  }
  ADD_FAILURE() << "no token is '" << text << "'";
  return -1;
}

std::unique_ptr<OutputConstraint> Make(const ConstraintSpec& spec) {
  auto c = OutputConstraint::Create(spec, O200kIndex());
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *std::move(c) : nullptr;
}

// A final JSON answer of `schema` (reasoning_budget 0: the final form only).
std::unique_ptr<OutputConstraint> JsonAnswer(const char* schema, int64_t reasoning_budget = 0) {
  ConstraintSpec spec;
  spec.json_final = true;
  spec.final_schema = schema;
  spec.reasoning_budget = reasoning_budget;
  return Make(spec);
}

// Advances `c` by the tokens of `text` taken one byte at a time where a
// byte is a token, after checking each is allowed.
void Feed(OutputConstraint& c, const std::vector<int32_t>& tokens) {
  for (int32_t t : tokens) ASSERT_TRUE(c.Advance(t).ok()) << t;
}

constexpr char kWeather[] = R"({"type": "object", "properties": {
    "city": {"type": "string"}, "unit": {"enum": ["celsius"]},
    "days": {"type": "integer"}}, "required": ["city", "unit", "days"],
    "additionalProperties": false})";

TEST(GrammarForced, FinalHeaderAndRequiredKeyOfAJsonAnswer) {
  ASSERT_NE(O200kIndex(), nullptr);
  auto c = JsonAnswer(kWeather);
  ASSERT_NE(c, nullptr);
  // No reasoning budget: the final form is the only one, and its JSON opens
  // with the first required key.
  EXPECT_EQ(Text(c->Forced()),
            Special(tokenizer::kChannel) + "final" + Special(tokenizer::kMessage) + "{\"city\":\"");
  // The state is unchanged: the mask still allows only <|channel|>.
  const uint32_t* mask = c->Mask();
  EXPECT_TRUE(TestBit(mask, tokenizer::kChannel));
  EXPECT_FALSE(TestBit(mask, tokenizer::kMessage));
  // Bounded.
  EXPECT_EQ(Text(c->Forced(3)), Special(tokenizer::kChannel) + "fi");
}

TEST(GrammarForced, FreeStringContentForcesNothingThenTheEnumAndKeysAreForced) {
  ASSERT_NE(O200kIndex(), nullptr);
  auto c = JsonAnswer(kWeather);
  ASSERT_NE(c, nullptr);
  Feed(*c, {tokenizer::kChannel, TokenOf("final"), tokenizer::kMessage, TokenOf("{\""),
            TokenOf("city"), TokenOf("\":\"")});
  EXPECT_TRUE(c->Forced().empty()) << Text(c->Forced());  // the city is free text
  Feed(*c, {TokenOf("Paris")});
  EXPECT_TRUE(c->Forced().empty()) << Text(c->Forced());  // more text or the closing quote
  Feed(*c, {TokenOf("\",\"")});
  // The key that must follow (properties in the schema's declared order:
  // city, unit, days), the one value of its enum, the next key, up to its
  // free number.
  EXPECT_EQ(Text(c->Forced()), "unit\":\"celsius\",\"days\":");
  Feed(*c, {TokenOf("unit"), TokenOf("\":\""), TokenOf("c"), TokenOf("elsius"), TokenOf("\",\""),
            TokenOf("days"), TokenOf("\":"), TokenOf("5")});
  EXPECT_TRUE(c->Forced().empty());  // more digits or the closing brace
  Feed(*c, {TokenOf("}")});
  // The document is whole: the end.
  EXPECT_EQ(Text(c->Forced()), Special(tokenizer::kReturn));
}

TEST(GrammarForced, EnumWithOneValueLeft) {
  ASSERT_NE(O200kIndex(), nullptr);
  auto c = JsonAnswer(R"({"type": "object", "properties": {
      "sky": {"enum": ["clear", "cloudy", "rain"]}}, "required": ["sky"],
      "additionalProperties": false})");
  ASSERT_NE(c, nullptr);
  Feed(*c, {tokenizer::kChannel, TokenOf("final"), tokenizer::kMessage});
  EXPECT_EQ(Text(c->Forced()), "{\"sky\":\"");
  Feed(*c, {TokenOf("{\""), TokenOf("sky"), TokenOf("\":\"")});
  EXPECT_TRUE(c->Forced().empty());  // three values to choose from
  Feed(*c, {TokenOf("cl")});
  EXPECT_TRUE(c->Forced().empty());  // clear or cloudy
  Feed(*c, {TokenOf("o")});
  // Only "cloudy" is left; after the object closes only <|return|> can follow.
  EXPECT_EQ(Text(c->Forced()), "udy\"}" + Special(tokenizer::kReturn));
}

TEST(GrammarForced, EndTokenAfterTheClosingBrace) {
  ASSERT_NE(O200kIndex(), nullptr);
  auto c = JsonAnswer(R"({"type": "object", "properties": {"n": {"type": "integer"}},
      "required": ["n"], "additionalProperties": false})");
  ASSERT_NE(c, nullptr);
  Feed(*c, {tokenizer::kChannel, TokenOf("final"), tokenizer::kMessage, TokenOf("{\""),
            TokenOf("n"), TokenOf("\":"), TokenOf("4")});
  EXPECT_TRUE(c->Forced().empty());  // more digits or the closing brace
  Feed(*c, {TokenOf("}")});
  EXPECT_EQ(Text(c->Forced()), Special(tokenizer::kReturn));
  Feed(*c, {tokenizer::kReturn});
  EXPECT_TRUE(c->complete());
  EXPECT_TRUE(c->Forced().empty());
}

TEST(GrammarForced, OneToolFormIsForcedUpToItsArguments) {
  ASSERT_NE(O200kIndex(), nullptr);
  ConstraintSpec spec;
  spec.tool_required = true;
  spec.tools.push_back({"get_weather", kWeather, true});
  auto c = Make(spec);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(Text(c->Forced()), Special(tokenizer::kChannel) +
                                   "commentary to=functions.get_weather" +
                                   Special(tokenizer::kConstrain) + "json" +
                                   Special(tokenizer::kMessage) + "{\"city\":\"");
}

TEST(GrammarForced, TwoFormsForceOnlyTheirCommonStart) {
  ASSERT_NE(O200kIndex(), nullptr);
  ConstraintSpec spec;
  spec.tools.push_back({"get_weather", kWeather, true});
  spec.tools.push_back({"get_time", "", true});
  spec.tool_required = true;
  auto c = Make(spec);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(Text(c->Forced()), Special(tokenizer::kChannel) + "commentary to=functions.get_");
  // With a final form and reasoning too, only <|channel|> is common.
  spec.tool_required = false;
  spec.reasoning_budget = 16;
  auto d = Make(spec);
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(Text(d->Forced()), Special(tokenizer::kChannel));
}

TEST(GrammarForced, FreeTextBodyForcesNothingUntilTheReasoningBudgetIsSpent) {
  ASSERT_NE(O200kIndex(), nullptr);
  auto c = JsonAnswer(R"({"type": "object", "properties": {"ok": {"type": "boolean"}},
      "required": ["ok"], "additionalProperties": false})",
                      /*reasoning_budget=*/2);
  ASSERT_NE(c, nullptr);
  Feed(*c, {tokenizer::kChannel, TokenOf("analysis"), tokenizer::kMessage});
  EXPECT_TRUE(c->Forced().empty());  // free reasoning or its end
  Feed(*c, {TokenOf("Hmm"), TokenOf(" ok")});
  // The budget is spent: <|end|>, then the next header (only the final form
  // is left) and the start of the JSON.
  EXPECT_EQ(Text(c->Forced()), Special(tokenizer::kEnd) + Special(tokenizer::kStart) + "assistant" +
                                   Special(tokenizer::kChannel) + "final" +
                                   Special(tokenizer::kMessage) + "{\"ok\":");
}

TEST(GrammarForced, AcceptedPrefixFeedsACopy) {
  ASSERT_NE(O200kIndex(), nullptr);
  auto c = JsonAnswer(kWeather);
  ASSERT_NE(c, nullptr);
  const std::vector<int32_t> good = {tokenizer::kChannel, TokenOf("final"), tokenizer::kMessage,
                                     TokenOf("{\""), TokenOf("city")};
  EXPECT_EQ(c->AcceptedPrefix(good), good.size());
  std::vector<int32_t> bad = good;
  bad[3] = TokenOf("[");
  EXPECT_EQ(c->AcceptedPrefix(bad), 3u);
  EXPECT_EQ(c->AcceptedPrefix({tokenizer::kMessage}), 0u);
  EXPECT_EQ(c->AcceptedPrefix({-1}), 0u);
  // Nothing was taken.
  EXPECT_TRUE(TestBit(c->Mask(), tokenizer::kChannel));
  Feed(*c, good);
  EXPECT_EQ(c->AcceptedPrefix({TokenOf("\":\""), TokenOf("Rome"), TokenOf("\",\"")}), 3u);
  // <|return|> only where the document is whole.
  EXPECT_EQ(c->AcceptedPrefix({tokenizer::kReturn}), 0u);
}

}  // namespace
}  // namespace flotilla::grammar
