#include "common/harmony/parser.h"

#include <gtest/gtest.h>

namespace flotilla::harmony {
namespace {

namespace tk = tokenizer;

class ParserTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto t = tk::Tokenizer::Create(tk::Tokenizer::DefaultRanksPath());
    ASSERT_TRUE(t.ok()) << t.status();
    tok_ = t->release();
  }
  static void TearDownTestSuite() { delete tok_; }
  static std::vector<tk::TokenId> Enc(const std::string& text) {
    return *tok_->Encode(text, tk::SpecialTokenPolicy::All());
  }
  static tk::Tokenizer* tok_;
};
tk::Tokenizer* ParserTest::tok_ = nullptr;

TEST_F(ParserTest, ReportsHeaderAndDeltasAsTheyHappen) {
  StreamParser p(tok_, {Role::kAssistant, true});
  std::vector<tk::TokenId> ids = Enc("<|channel|>analysis<|message|>Think.<|end|>"
                                     "<|start|>assistant<|channel|>final<|message|>Hi there<|return|>");
  std::string analysis, final_text;
  int started = 0, ended = 0;
  for (tk::TokenId id : ids) {
    auto ev = p.Process(id);
    ASSERT_TRUE(ev.ok()) << ev.status();
    if (*ev == StreamParser::Event::kMessageStarted) {
      ++started;
      EXPECT_EQ(p.state(), StreamParser::State::kContent);
      EXPECT_EQ(p.current().role, Role::kAssistant);
      EXPECT_EQ(p.current().channel, started == 1 ? "analysis" : "final");
    }
    if (*ev == StreamParser::Event::kContentDelta) {
      (p.current().channel == "analysis" ? analysis : final_text) += p.last_content_delta();
      EXPECT_EQ(p.current().content, p.current().channel == "analysis" ? analysis : final_text);
    }
    if (*ev == StreamParser::Event::kMessageEnded) ++ended;
  }
  ASSERT_TRUE(p.Finish().ok());
  EXPECT_EQ(started, 2);
  EXPECT_EQ(ended, 2);
  EXPECT_EQ(analysis, "Think.");
  EXPECT_EQ(final_text, "Hi there");
  ASSERT_EQ(p.end_tokens().size(), 2u);
  EXPECT_EQ(p.end_tokens()[0], tk::kEnd);
  EXPECT_EQ(p.end_tokens()[1], tk::kReturn);
}

TEST_F(ParserTest, RecipientBeforeOrAfterChannelAndConstrain) {
  for (const char* text :
       {"<|start|>assistant to=functions.f<|channel|>commentary <|constrain|>json<|message|>{}<|call|>",
        "<|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json<|message|>{}<|call|>",
        "<|start|>assistant<|channel|>commentary to=functions.f<|constrain|>json<|message|>{}<|call|>"}) {
    auto msgs = ParseCompletion(*tok_, Enc(text), {});
    ASSERT_TRUE(msgs.ok()) << text << ": " << msgs.status();
    ASSERT_EQ(msgs->size(), 1u);
    EXPECT_EQ((*msgs)[0].channel, "commentary") << text;
    EXPECT_EQ((*msgs)[0].recipient, "functions.f") << text;
    EXPECT_EQ((*msgs)[0].content_type, "<|constrain|>json") << text;
    EXPECT_EQ((*msgs)[0].content, "{}");
  }
}

TEST_F(ParserTest, PartialUtf8AcrossTokensIsHeldBack) {
  // "é😀" as single-byte tokens: no delta may hold half a character.
  std::vector<tk::TokenId> ids = Enc("<|start|>assistant<|channel|>final<|message|>");
  for (unsigned char b : std::string("é😀")) {
    for (tk::TokenId id = 0; id < 1024; ++id) {
      auto bytes = tok_->TokenBytes(id);
      if (bytes->size() == 1 && static_cast<unsigned char>((*bytes)[0]) == b) {
        ids.push_back(id);
        break;
      }
    }
  }
  ids.push_back(tk::kReturn);
  StreamParser p(tok_, {});
  std::vector<std::string> deltas;
  for (tk::TokenId id : ids) {
    auto ev = p.Process(id);
    ASSERT_TRUE(ev.ok()) << ev.status();
    if (*ev == StreamParser::Event::kContentDelta) deltas.push_back(p.last_content_delta());
  }
  EXPECT_EQ(deltas, (std::vector<std::string>{"", "é", "", "", "", "😀"}));
  EXPECT_EQ(p.messages().at(0).content, "é😀");
}

TEST_F(ParserTest, CompletionStoppingMidHeader) {
  auto ids = Enc("<|start|>assistant<|channel|>fin");
  auto strict = ParseCompletion(*tok_, ids, {});
  ASSERT_FALSE(strict.ok());
  EXPECT_NE(std::string(strict.status().message()).find("mid-header"), std::string::npos) << strict.status();

  auto lenient = ParseCompletion(*tok_, ids, {std::nullopt, false});
  ASSERT_TRUE(lenient.ok()) << lenient.status();
  ASSERT_EQ(lenient->size(), 1u);
  EXPECT_EQ((*lenient)[0].channel, "fin");
}

TEST_F(ParserTest, InvalidTokenIdIsAnErrorInBothModes) {
  for (bool strict : {true, false}) {
    StreamParser p(tok_, {Role::kAssistant, strict});
    auto ev = p.Process(201088);
    ASSERT_FALSE(ev.ok());
    EXPECT_NE(std::string(ev.status().message()).find("201088"), std::string::npos) << ev.status();
  }
}

TEST_F(ParserTest, MalformedHeadersStrictAndRecovered) {
  // Unknown role with nothing else; two content types; <|message|> missing.
  const char* bad[] = {
      "<|start|>wizard<|message|>hi<|end|>",
      "<|start|>assistant<|channel|>final json code<|message|>hi<|end|>",
      "<|start|>assistant<|channel|>final The answer is 4.<|return|>",
      "<|start|>assistant<|channel|><|message|>hi<|end|>",
  };
  for (const char* text : bad) {
    auto strict = ParseCompletion(*tok_, Enc(text), {});
    EXPECT_FALSE(strict.ok()) << text;
    StreamParser p(tok_, {std::nullopt, false});
    for (tk::TokenId id : Enc(text)) ASSERT_TRUE(p.Process(id).ok()) << text;
    ASSERT_TRUE(p.Finish().ok()) << text;
    ASSERT_EQ(p.messages().size(), 1u) << text;
    EXPECT_FALSE(p.warnings().empty()) << text;
  }
  // The recovered missing-<|message|> case keeps the channel and the text.
  auto rec = ParseCompletion(*tok_, Enc(bad[2]), {std::nullopt, false});
  ASSERT_TRUE(rec.ok());
  EXPECT_EQ((*rec)[0].channel, "final");
  EXPECT_EQ((*rec)[0].content, "The answer is 4.");

  // Recovery goes on to parse the next message normally.
  auto two = ParseCompletion(
      *tok_, Enc("<|start|>wizard<|message|>x<|end|><|start|>assistant<|channel|>final<|message|>ok<|return|>"),
      {std::nullopt, false});
  ASSERT_TRUE(two.ok());
  ASSERT_EQ(two->size(), 2u);
  EXPECT_EQ((*two)[1].content, "ok");
}

TEST_F(ParserTest, StrayTokens) {
  EXPECT_FALSE(ParseCompletion(*tok_, Enc("hello<|start|>assistant<|message|>x<|end|>"), {}).ok());
  EXPECT_FALSE(ParseCompletion(*tok_, Enc("<|start|>assistant<|message|>x<|channel|>y<|end|>"), {}).ok());
  auto lenient = ParseCompletion(*tok_, Enc("hello<|start|>assistant<|message|>x<|end|>"), {std::nullopt, false});
  ASSERT_TRUE(lenient.ok());
  EXPECT_EQ(lenient->size(), 1u);
}

TEST_F(ParserTest, InvalidUtf8ContentStrictVersusReplaced) {
  tk::TokenId lone_continuation = 0;
  for (tk::TokenId id = 0; id < 1024; ++id) {
    auto b = tok_->TokenBytes(id);
    if (b->size() == 1 && static_cast<unsigned char>((*b)[0]) == 0xA9) lone_continuation = id;
  }
  std::vector<tk::TokenId> ids = Enc("<|start|>assistant<|channel|>final<|message|>a");
  ids.push_back(lone_continuation);
  ids.push_back(tk::kReturn);
  EXPECT_FALSE(ParseCompletion(*tok_, ids, {}).ok());
  auto lenient = ParseCompletion(*tok_, ids, {std::nullopt, false});
  ASSERT_TRUE(lenient.ok());
  EXPECT_EQ((*lenient)[0].content, "a\xEF\xBF\xBD");
}

TEST(ParseHeader, Forms) {
  auto tool = ParseHeader("functions.lookup to=assistant<|channel|>commentary", std::nullopt);
  ASSERT_TRUE(tool.ok());
  EXPECT_EQ(tool->role, Role::kTool);
  EXPECT_EQ(tool->name, "functions.lookup");
  EXPECT_EQ(tool->recipient, "assistant");
  EXPECT_FALSE(ParseHeader("", std::nullopt).ok());
  EXPECT_FALSE(ParseHeader("assistant to=a to=b", std::nullopt).ok());
  EXPECT_FALSE(ParseHeader("assistant<|channel|>a<|channel|>b", std::nullopt).ok());
  auto preset = ParseHeader("<|channel|>final", Role::kAssistant);
  ASSERT_TRUE(preset.ok());
  EXPECT_EQ(preset->channel, "final");
}

}  // namespace
}  // namespace flotilla::harmony
