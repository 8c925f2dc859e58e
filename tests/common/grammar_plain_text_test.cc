// The mask of a state inside a JSON string, found as "every plain-text token
// that fits, plus whatever else the matcher takes" (VocabularyIndex::
// AllowPlainText, JsonMatcher::PlainStringRoom), is bit for bit the mask the
// full walk over the vocabulary finds.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "common/grammar/json_matcher.h"
#include "common/grammar/vocabulary_index.h"
#include "tests/common/grammar_test_util.h"

namespace flotilla::grammar {
namespace {

using testing_util::Compiled;
using testing_util::O200kIndex;

std::vector<int32_t> Set(const std::vector<uint32_t>& mask, int vocab) {
  std::vector<int32_t> out;
  for (int32_t t = 0; t < vocab; ++t) {
    if (TestBit(mask.data(), t)) out.push_back(t);
  }
  return out;
}

TEST(GrammarPlainText, PlainTokensAreWholeCharactersOfStringText) {
  TokenVocabulary v;
  v.bytes = {"ab",
             "\xC3\xA9",
             "\xC3",
             "\"x",
             "a\\",
             "\n",
             "\xED\xA0\x80",
             "\xE2\x82\xAC",
             "a\xC3\xA9"
             "b",
             "",
             "\xF0\x9F\x98",
             "\x7F",
             "\xC0\xAF",
             " "};
  v.vocab_size = static_cast<int>(v.bytes.size());
  const VocabularyIndex index(v);
  std::vector<uint32_t> any(index.words()), one(index.words()), none(index.words());
  index.AllowPlainText(-1, any.data());
  index.AllowPlainText(1, one.data());
  index.AllowPlainText(0, none.data());
  // "ab", "é", "€", "aéb", " ": whole characters; a lone lead byte, a
  // quote, a backslash, a newline, a surrogate, DEL, an overlong form and a
  // character cut short are not plain.
  EXPECT_EQ(Set(any, v.vocab_size), (std::vector<int32_t>{0, 1, 7, 8, 13}));
  EXPECT_EQ(Set(one, v.vocab_size), (std::vector<int32_t>{1, 7, 13}));
  EXPECT_EQ(Set(none, v.vocab_size), std::vector<int32_t>{});
}

// Random token walks through string-heavy schemas over o200k: wherever the
// fast path applies, its mask equals the full walk's.
TEST(GrammarPlainText, MaskInsideAStringEqualsTheFullWalk) {
  auto index = O200kIndex();
  ASSERT_NE(index, nullptr);
  const TokenVocabulary& v = index->vocab();
  const char* const kSchemas[] = {
      R"({"type": "object", "properties": {"title": {"type": "string", "maxLength": 12},
          "note": {"type": "string", "minLength": 3, "maxLength": 5}, "body": {"type": "string"}},
          "required": ["title", "note", "body"], "additionalProperties": false})",
      R"({"type": "array", "items": {"type": "string", "maxLength": 2}, "maxItems": 3})",
      R"({"type": "object"})",
      R"({"type": "object", "propertyNames": {"maxLength": 4},
          "additionalProperties": {"type": "string", "minLength": 2}})",
  };
  std::mt19937 rng(7);
  int fast = 0;
  for (const char* text : kSchemas) {
    const CompiledSchema schema = Compiled(text);
    const JsonMatcher m(&schema);
    auto feed = [&m](MatchState& s, uint8_t b) { return m.Feed(s, b); };
    std::vector<MatchState> scratch;
    for (int walk = 0; walk < 3; ++walk) {
      MatchState st = m.Start();
      for (int step = 0; step < 24 && !m.Finished(st); ++step) {
        std::vector<uint32_t> full(index->words()), quick(index->words());
        index->AllowAccepted(st, feed, &scratch, full.data());
        int64_t room = 0;
        if (m.PlainStringRoom(st, &room)) {
          index->AllowPlainText(room, quick.data());
          index->AllowAcceptedNotPlain(st, feed, &scratch, quick.data());
          ASSERT_EQ(quick, full) << text << " room " << room << " step " << step;
          ++fast;
        }
        const std::vector<int32_t> allowed = Set(full, v.vocab_size);
        if (allowed.empty()) break;
        // Mostly short tokens, so that walks reach the strings' bounds.
        int32_t pick = allowed[rng() % allowed.size()];
        for (int tries = 0; tries < 4 && v.bytes[pick].size() > 2; ++tries) {
          pick = allowed[rng() % allowed.size()];
        }
        for (char c : v.bytes[pick]) ASSERT_TRUE(m.Feed(st, static_cast<uint8_t>(c)));
      }
    }
  }
  EXPECT_GT(fast, 20);  // the walks spent most of their steps inside strings
}

// The shared-prefix walk (with its skips) sets exactly the tokens whose
// bytes the matcher takes one by one, at states of every kind.
TEST(GrammarPlainText, WalkEqualsFeedingEachToken) {
  auto index = O200kIndex();
  ASSERT_NE(index, nullptr);
  const TokenVocabulary& v = index->vocab();
  const CompiledSchema schema = Compiled(
      R"({"type": "object", "properties": {"n": {"type": "integer", "minimum": -5,
          "maximum": 300}, "tag": {"enum": ["red", "green"]}, "s": {"type": "string",
          "maxLength": 3}, "ok": {"type": "boolean"}}, "required": ["n", "tag", "s", "ok"]})");
  const JsonMatcher m(&schema);
  auto feed = [&m](MatchState& s, uint8_t b) { return m.Feed(s, b); };
  std::vector<MatchState> scratch;
  // (Properties come in the schema's declared order: n, tag, s, ok.)
  for (const char* prefix :
       {"", "{", "{\"n\":", "{\"n\":2", "{\"n\":-", "{\"n\":29,\"tag\":\"",
        "{\"n\":1,\"tag\":\"red\",\"s\":\"ab", "{\"n\":1,\"tag\":\"green\",\"s\":\"\",\"ok\":"}) {
    MatchState st = m.Start();
    for (const char* c = prefix; *c; ++c) ASSERT_TRUE(m.Feed(st, static_cast<uint8_t>(*c)));
    std::vector<uint32_t> walked(index->words()), fed(index->words());
    index->AllowAccepted(st, feed, &scratch, walked.data());
    for (int32_t t = 0; t < v.vocab_size; ++t) {
      if (v.bytes[t].empty()) continue;
      MatchState s = st;
      bool ok = true;
      for (char c : v.bytes[t]) ok = ok && m.Feed(s, static_cast<uint8_t>(c));
      if (ok) SetBit(fed.data(), t);
    }
    EXPECT_EQ(walked, fed) << prefix;
    EXPECT_FALSE(Set(fed, v.vocab_size).empty()) << prefix;
  }
}

}  // namespace
}  // namespace flotilla::grammar
