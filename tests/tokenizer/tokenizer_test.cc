#include "common/tokenizer/tokenizer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <fstream>

#include "common/tokenizer/streaming_detokenizer.h"

namespace flotilla::tokenizer {
namespace {

class TokenizerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto t = Tokenizer::Create(Tokenizer::DefaultRanksPath());
    ASSERT_TRUE(t.ok()) << t.status();
    tok_ = t->release();
  }
  static void TearDownTestSuite() { delete tok_; }
  static Tokenizer* tok_;
};
Tokenizer* TokenizerTest::tok_ = nullptr;

TEST_F(TokenizerTest, HelloWorld) {
  auto ids = tok_->Encode("hello world", SpecialTokenPolicy::None());
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(*ids, (std::vector<TokenId>{24912, 2375}));
}

TEST_F(TokenizerTest, SpecialTokenIdsAndNames) {
  EXPECT_EQ(tok_->SpecialTokenId("<|start|>"), kStart);
  EXPECT_EQ(tok_->SpecialTokenId("<|message|>"), kMessage);
  EXPECT_EQ(tok_->SpecialTokenId("<|return|>"), kReturn);
  EXPECT_EQ(tok_->SpecialTokenId("<|constrain|>"), kConstrain);
  EXPECT_EQ(tok_->SpecialTokenId("<|channel|>"), kChannel);
  EXPECT_EQ(tok_->SpecialTokenId("<|end|>"), kEnd);
  EXPECT_EQ(tok_->SpecialTokenId("<|call|>"), kCall);
  EXPECT_EQ(tok_->SpecialTokenId("<|startoftext|>"), kStartOfText);
  EXPECT_EQ(tok_->SpecialTokenId("<|endoftext|>"), kEndOfText);
  EXPECT_EQ(tok_->SpecialTokenId("<|reserved_200000|>"), 200000u);
  EXPECT_EQ(tok_->SpecialTokenId("<|reserved_201087|>"), 201087u);
  EXPECT_EQ(tok_->SpecialTokenId("<|reserved_201088|>"), std::nullopt);
  EXPECT_EQ(tok_->SpecialTokenId("<|reserved_200006|>"), std::nullopt);  // that id is <|start|>
  EXPECT_EQ(*tok_->TokenBytes(200013), "<|reserved_200013|>");
  EXPECT_EQ(tok_->vocab_size(), 201088u);
}

TEST_F(TokenizerTest, SpecialTokenPolicy) {
  const std::string text = "<|start|>user<|message|>hi<|end|>";
  auto all = tok_->Encode(text, SpecialTokenPolicy::All());
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->front(), kStart);
  EXPECT_EQ(all->back(), kEnd);

  auto none = tok_->Encode(text, SpecialTokenPolicy::None());
  ASSERT_FALSE(none.ok());
  EXPECT_NE(std::string(none.status().message()).find("<|start|>"), std::string::npos) << none.status();

  auto ordinary = tok_->Encode(text, SpecialTokenPolicy::Ordinary());
  ASSERT_TRUE(ordinary.ok());
  for (TokenId id : *ordinary) EXPECT_FALSE(Tokenizer::IsSpecial(id));
  EXPECT_EQ(*tok_->DecodeUtf8(*ordinary), text);

  SpecialTokenPolicy only_start;
  only_start.allowed = SpecialTokenPolicy::Allowed::kListed;
  only_start.listed = {"<|start|>"};
  EXPECT_FALSE(tok_->Encode(text, only_start).ok());  // <|message|> is not allowed
  only_start.disallowed_is_error = false;
  auto listed = tok_->Encode(text, only_start);
  ASSERT_TRUE(listed.ok());
  EXPECT_EQ(listed->front(), kStart);
  size_t specials = 0;
  for (TokenId id : *listed) specials += Tokenizer::IsSpecial(id);
  EXPECT_EQ(specials, 1u);
  // Unknown names are text, not errors.
  EXPECT_TRUE(tok_->Encode("<|im_start|> <|reserved_9|>", SpecialTokenPolicy::None()).ok());
}

TEST_F(TokenizerTest, SpecialTokensInsideOtherText) {
  auto ids = tok_->Encode("<|<|start|>|>", SpecialTokenPolicy::All());
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(std::count(ids->begin(), ids->end(), kStart), 1);
  EXPECT_EQ(*tok_->DecodeUtf8(*ids), "<|<|start|>|>");
  // Many openers and a closer far away: still fine (and fast).
  std::string many;
  for (int i = 0; i < 100000; ++i) many += "<|";
  many += "end|>";
  auto big = tok_->Encode(many, SpecialTokenPolicy::All());
  ASSERT_TRUE(big.ok());
  EXPECT_EQ(big->back(), kEnd);
  EXPECT_EQ(*tok_->DecodeUtf8(*big), many);
}

TEST_F(TokenizerTest, DecodeRoundTripAndInvalidIds) {
  const std::string text = "Grüße, 世界! 👨‍👩‍👧 I'M here\t\t\n  x";
  auto ids = tok_->EncodeOrdinary(text);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*tok_->DecodeBytes(*ids), text);
  EXPECT_EQ(*tok_->DecodeUtf8(*ids), text);

  auto bad = tok_->DecodeBytes({24912, 201088});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(std::string(bad.status().message()).find("201088"), std::string::npos) << bad.status();
  EXPECT_FALSE(tok_->TokenBytes(4000000000u).ok());
}

TEST_F(TokenizerTest, StrictUtf8) {
  // "é" is two bytes; a token that is only its first byte decodes to bytes but
  // not to UTF-8.
  auto lead = tok_->EncodeOrdinary("\xC3");
  EXPECT_FALSE(lead.ok());  // encoding checks its input too
  // Find the byte tokens for 0xC3 and 0xA9 by decoding the single-byte ranks.
  TokenId c3 = 0, a9 = 0;
  for (TokenId id = 0; id < 256 * 4; ++id) {
    auto b = tok_->TokenBytes(id);
    if (b->size() == 1 && static_cast<unsigned char>((*b)[0]) == 0xC3) c3 = id;
    if (b->size() == 1 && static_cast<unsigned char>((*b)[0]) == 0xA9) a9 = id;
  }
  ASSERT_NE(c3, 0u);
  ASSERT_NE(a9, 0u);
  EXPECT_EQ(*tok_->DecodeBytes({c3}), "\xC3");
  auto strict = tok_->DecodeUtf8({c3});
  ASSERT_FALSE(strict.ok());
  EXPECT_NE(std::string(strict.status().message()).find("offset 0"), std::string::npos) << strict.status();
  EXPECT_EQ(*tok_->DecodeUtf8({c3, a9}), "\xC3\xA9");
  EXPECT_FALSE(tok_->DecodeUtf8({a9}).ok());

  auto enc = tok_->Encode("ok \xFF bad", SpecialTokenPolicy::None());
  ASSERT_FALSE(enc.ok());
  EXPECT_NE(std::string(enc.status().message()).find("offset 3"), std::string::npos) << enc.status();
}

TEST_F(TokenizerTest, StreamingDetokenizerHoldsBackIncompleteCharacters) {
  const std::string text = "a€b😀c";
  // Byte tokens, so that every multi-byte character is split across tokens.
  std::vector<TokenId> ids;
  for (unsigned char ch : text) {
    for (TokenId id = 0; id < 1024; ++id) {
      auto b = tok_->TokenBytes(id);
      if (b->size() == 1 && static_cast<unsigned char>((*b)[0]) == ch) {
        ids.push_back(id);
        break;
      }
    }
  }
  ASSERT_EQ(ids.size(), text.size());
  StreamingDetokenizer d(tok_);
  std::vector<std::string> pieces;
  for (TokenId id : ids) {
    auto s = d.Append(id);
    ASSERT_TRUE(s.ok()) << s.status();
    pieces.push_back(*s);
  }
  EXPECT_EQ(pieces, (std::vector<std::string>{"a", "", "", "€", "b", "", "", "", "😀", "c"}));
  EXPECT_EQ(*d.Finish(), "");

  // A stream that ends inside a character.
  StreamingDetokenizer cut(tok_);
  ASSERT_TRUE(cut.Append(ids[1]).ok());
  EXPECT_EQ(cut.pending_bytes(), 1u);
  EXPECT_FALSE(cut.Finish().ok());
  StreamingDetokenizer lenient(tok_, StreamingDetokenizer::InvalidBytes::kReplace);
  ASSERT_TRUE(lenient.Append(ids[1]).ok());
  EXPECT_EQ(*lenient.Finish(), "\xEF\xBF\xBD");

  // A continuation byte with no lead byte can never be valid.
  StreamingDetokenizer strict(tok_);
  auto bad = strict.Append(ids[2]);
  EXPECT_FALSE(bad.ok());
  StreamingDetokenizer replace(tok_, StreamingDetokenizer::InvalidBytes::kReplace);
  EXPECT_EQ(*replace.Append(ids[2]), "\xEF\xBF\xBD");
  EXPECT_FALSE(replace.Append(kVocabSize).ok());
  // Special tokens stream as their names.
  StreamingDetokenizer sp(tok_);
  EXPECT_EQ(*sp.Append(kStart), "<|start|>");
}

TEST_F(TokenizerTest, LongRunsUseTheSameMergeOrder) {
  // Long pieces take the heap-based merge; they must agree with short-piece
  // merging on the same content split differently.
  std::string spaces(5000, ' ');
  auto ids = tok_->EncodeOrdinary(spaces + "x");
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*tok_->DecodeUtf8(*ids), spaces + "x");
  std::string symbols;
  for (int i = 0; i < 400; ++i) symbols += "=-*#"[i % 4];
  auto sym = tok_->EncodeOrdinary(symbols);
  ASSERT_TRUE(sym.ok());
  EXPECT_EQ(*tok_->DecodeUtf8(*sym), symbols);
}

TEST(TokenizerLoad, MissingAndCorruptFilesAreClearErrors) {
  auto missing = Tokenizer::Create("/nonexistent/o200k_base.ranks");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(std::string(missing.status().message()).find("/nonexistent/o200k_base.ranks"), std::string::npos);

  const std::string path = ::testing::TempDir() + "/corrupt.ranks";
  std::ofstream(path) << "FLTRANK1 not really";
  auto corrupt = Tokenizer::Create(path);
  ASSERT_FALSE(corrupt.ok());
  EXPECT_NE(std::string(corrupt.status().message()).find("malformed"), std::string::npos) << corrupt.status();
}

TEST(TokenizerLoad, DefaultPathIsFoundFromTheBuildTree) {
  const std::string path = Tokenizer::DefaultRanksPath();
  EXPECT_TRUE(std::ifstream(path).good()) << path;
  auto t0 = std::chrono::steady_clock::now();
  auto tok = Tokenizer::Create(path);
  ASSERT_TRUE(tok.ok()) << tok.status();
  std::cout << "tokenizer load: "
            << std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count()
            << " ms\n";
}

}  // namespace
}  // namespace flotilla::tokenizer
