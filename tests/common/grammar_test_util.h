// What the grammar tests share: whole byte sequences through a JsonMatcher,
// random walks through one, schemas compiled from text, and the o200k
// vocabulary index loaded once per test program.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/grammar/json_matcher.h"
#include "common/grammar/o200k_vocabulary.h"
#include "common/grammar/schema.h"
#include "common/grammar/vocabulary_index.h"
#include "tests/common/json_schema_validator.h"

namespace flotilla::grammar::testing_util {

// Whether `text` is a whole document `schema` accepts.
inline bool Accepts(const CompiledSchema& schema, const std::string& text) {
  return MatchesWhole(schema, text);
}

// Whether `text` is a prefix some accepted document continues.
inline bool Continues(const CompiledSchema& schema, const std::string& text) {
  JsonMatcher m(&schema);
  MatchState s = m.Start();
  for (char c : text) {
    if (!m.Feed(s, static_cast<uint8_t>(c))) return false;
  }
  return true;
}

// The schema `text` compiled; a failure is the test's (an empty schema back).
inline CompiledSchema Compiled(const std::string& text) {
  absl::StatusOr<CompiledSchema> s = CompileSchema(nlohmann::ordered_json::parse(text));
  EXPECT_TRUE(s.ok()) << text << ": " << s.status();
  return s.ok() ? *s : CompiledSchema{};
}

struct Walk {
  std::string doc;
  bool dead_end = false;  // a step where the matcher allowed no byte
  bool can_end = false;   // the matcher may end after `doc`
};

// A random walk through the matcher of `schema`: at each step a random byte
// among the ASCII ones it allows (closing bytes favoured, so that walks end),
// up to 400 bytes or until it is finished. Where it may end, the walk stops
// there with probability 1 / `end_one_in` (0: only when finished). A dead end
// stops it.
inline Walk RandomWalk(const CompiledSchema& schema, std::mt19937& rng, int end_one_in) {
  JsonMatcher m(&schema);
  MatchState st = m.Start();
  Walk walk;
  for (int step = 0; step < 400 && !m.Finished(st); ++step) {
    if (end_one_in > 0 && m.CanEnd(st) && rng() % end_one_in == 0) break;
    std::vector<uint8_t> ok;
    for (int b = 0; b < 128; ++b) {
      MatchState t = st;
      if (m.Feed(t, static_cast<uint8_t>(b))) ok.push_back(static_cast<uint8_t>(b));
    }
    if (ok.empty()) {
      walk.dead_end = true;
      break;
    }
    uint8_t pick = ok[rng() % ok.size()];
    for (uint8_t b : ok) {
      if ((b == '"' || b == '}' || b == ']' || b == ',') && rng() % 2) pick = b;
    }
    m.Feed(st, pick);
    walk.doc.push_back(static_cast<char>(pick));
  }
  walk.can_end = m.CanEnd(st);
  return walk;
}

// `walks` random walks through the matcher of the schema `text` (RandomWalk,
// ending early one time in `end_one_in`): none may meet a dead end, and each
// must end in JSON an independent validator accepts against the schema.
inline void ExpectWalksValidate(const char* text, std::mt19937& rng, int walks, int end_one_in) {
  const nlohmann::json schema = nlohmann::json::parse(text);
  const CompiledSchema compiled = Compiled(text);
  for (int i = 0; i < walks; ++i) {
    const Walk walk = RandomWalk(compiled, rng, end_one_in);
    ASSERT_FALSE(walk.dead_end) << text << " dead end after " << walk.doc;
    ASSERT_TRUE(walk.can_end) << walk.doc;
    const nlohmann::json v = nlohmann::json::parse(walk.doc, nullptr, false);
    ASSERT_FALSE(v.is_discarded()) << walk.doc;
    EXPECT_TRUE(schema_check::SchemaValid(schema, v, schema)) << text << "\n" << walk.doc;
  }
}

// The o200k vocabulary's index (201088 ids), loaded once; null (and a test
// failure) when it cannot be read.
inline std::shared_ptr<const VocabularyIndex> O200kIndex() {
  static std::shared_ptr<const VocabularyIndex> index = [] {
    absl::StatusOr<std::shared_ptr<const VocabularyIndex>> i = LoadO200kIndex(201088);
    EXPECT_TRUE(i.ok()) << i.status();
    return i.ok() ? *i : nullptr;
  }();
  return index;
}

}  // namespace flotilla::grammar::testing_util
