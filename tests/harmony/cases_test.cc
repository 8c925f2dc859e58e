// The Harmony reference cases: kind=render compares the rendered prompt text
// (and that its tokens decode to it), kind=parse parses completion tokens (or
// text encoded with special tokens allowed) into messages, kind=encode tokenizes.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "common/harmony/parser.h"
#include "common/harmony/renderer.h"
#include "tests/harmony_completion.h"

namespace flotilla::harmony {
namespace {

using Json = nlohmann::ordered_json;
namespace tk = tokenizer;

// The cases of one file under tests/data/harmony.
std::vector<Json> LoadCases(const std::string& file = "cases.json") {
  std::ifstream in(std::string(FLOTILLA_SOURCE_DIR) + "/tests/data/harmony/" + file);
  if (!in) return {};
  Json j = Json::parse(in, nullptr, false);
  if (j.is_discarded() || !j.contains("cases")) return {};
  return j["cases"].get<std::vector<Json>>();
}

using test_support::Tok;

class HarmonyCase : public ::testing::TestWithParam<Json> {};

TEST(HarmonyCases, FileHasAllKinds) {
  auto cases = LoadCases();
  ASSERT_EQ(cases.size(), 22u) << "tests/data/harmony/cases.json missing or changed";
  int render = 0, parse = 0, encode = 0;
  for (const auto& c : cases) {
    render += c["kind"] == "render";
    parse += c["kind"] == "parse";
    encode += c["kind"] == "encode";
  }
  EXPECT_EQ(render + parse + encode, 22);
}

TEST_P(HarmonyCase, Passes) {
  const Json& c = GetParam();
  const std::string kind = c["kind"];
  const tk::Tokenizer& tok = Tok();
  if (kind == "render") {
    auto conv = ConversationFromJson(c["conversation"]);
    ASSERT_TRUE(conv.ok()) << conv.status();
    RenderOptions opts;
    opts.auto_drop_analysis = c.value("auto_drop_analysis", true);
    auto rendered = RenderForCompletion(*conv, opts);
    ASSERT_TRUE(rendered.ok()) << rendered.status();
    const std::string want = c["expected_text"];
    EXPECT_EQ(rendered->Text(), want);
    // The token form decodes to the same text, and special tokens are tokens.
    std::vector<tk::TokenId> ids = rendered->Tokens(tok);
    auto decoded = tok.DecodeUtf8(ids);
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    EXPECT_EQ(*decoded, want);
    auto reencoded = tok.Encode(want, tk::SpecialTokenPolicy::All());
    ASSERT_TRUE(reencoded.ok());
    EXPECT_EQ(ids, *reencoded);
  } else if (kind == "parse") {
    std::vector<tk::TokenId> tokens;
    if (c.contains("tokens")) {
      tokens = c["tokens"].get<std::vector<tk::TokenId>>();
    } else {
      auto enc = tok.Encode(c["text"].get<std::string>(), tk::SpecialTokenPolicy::All());
      ASSERT_TRUE(enc.ok()) << enc.status();
      tokens = *enc;
    }
    ParserOptions opts;
    if (c.contains("start_role")) {
      auto role = ParseRole(c["start_role"].get<std::string>());
      ASSERT_TRUE(role.ok());
      opts.start_role = *role;
    }
    auto messages = ParseCompletion(tok, tokens, opts);
    ASSERT_TRUE(messages.ok()) << messages.status();
    if (c.contains("expected_message_count")) {
      EXPECT_EQ(messages->size(), c["expected_message_count"].get<size_t>());
    }
    if (c.contains("expected_messages")) {
      Json got = Json::array();
      for (const auto& m : *messages) got.push_back(MessageToJson(m));
      EXPECT_EQ(got, c["expected_messages"]) << got.dump(1);
    }
  } else if (kind == "encode") {
    auto policy = c.value("allow_special", false) ? tk::SpecialTokenPolicy::All() : tk::SpecialTokenPolicy::None();
    auto ids = tok.Encode(c["text"].get<std::string>(), policy);
    ASSERT_TRUE(ids.ok()) << ids.status();
    EXPECT_EQ(*ids, c["expected_tokens"].get<std::vector<tk::TokenId>>());
  } else {
    FAIL() << "unknown case kind " << kind;
  }
}

std::string CaseName(const ::testing::TestParamInfo<Json>& info) { return info.param["name"].get<std::string>(); }

INSTANTIATE_TEST_SUITE_P(Reference, HarmonyCase, ::testing::ValuesIn(LoadCases()), CaseName);

// One render case per JSON Schema construct and per built-in tool, with the
// text the reference renderer's rules give (tests/data/harmony/README.md).
TEST(HarmonyCases, SchemaFileHasACasePerConstruct) {
  auto cases = LoadCases("schema_cases.json");
  ASSERT_GE(cases.size(), 14u) << "tests/data/harmony/schema_cases.json missing or cut short";
  for (const auto& c : cases) EXPECT_EQ(c["kind"], "render") << c["name"];
}

INSTANTIATE_TEST_SUITE_P(Schemas, HarmonyCase, ::testing::ValuesIn(LoadCases("schema_cases.json")), CaseName);

}  // namespace
}  // namespace flotilla::harmony
