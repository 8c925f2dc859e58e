// MaskCache: masks shared by every constraint over one vocabulary.
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <vector>

#include "common/grammar/mask_cache.h"
#include "common/grammar/o200k_vocabulary.h"
#include "common/grammar/output_constraint.h"
#include "tests/common/grammar_test_util.h"

namespace flotilla::grammar {
namespace {

using testing_util::O200kIndex;

TEST(GrammarMaskCache, EvictsTheOldestPastItsBound) {
  const std::vector<uint32_t> a(100, 1u), b(100, 2u), c(100, 3u);
  // Room for two entries of 100 words and short keys.
  MaskCache cache(2 * (100 * sizeof(uint32_t) + 2 * 3 + 64));
  cache.Insert("one", a.data(), a.size());
  cache.Insert("two", b.data(), b.size());
  std::vector<uint32_t> out(100);
  ASSERT_TRUE(cache.Lookup("one", out.data(), out.size()));
  EXPECT_EQ(out, a);
  cache.Insert("six", c.data(), c.size());
  EXPECT_FALSE(cache.Lookup("one", out.data(), out.size()));  // the oldest went
  ASSERT_TRUE(cache.Lookup("two", out.data(), out.size()));
  EXPECT_EQ(out, b);
  ASSERT_TRUE(cache.Lookup("six", out.data(), out.size()));
  EXPECT_EQ(out, c);
  EXPECT_FALSE(cache.Lookup("two", out.data(), 99));  // a different width is no hit
  EXPECT_EQ(cache.counts().entries, 2u);
}

TEST(GrammarMaskCache, OneCachePerLiveVocabulary) {
  ASSERT_NE(O200kIndex(), nullptr);
  EXPECT_EQ(MaskCache::For(O200kIndex()), MaskCache::For(O200kIndex()));
  auto other = std::make_shared<const VocabularyIndex>(O200kIndex()->vocab());
  EXPECT_NE(MaskCache::For(other), MaskCache::For(O200kIndex()));
}

// Drives a constraint along one path, recording every mask.
std::vector<std::vector<uint32_t>> Masks(OutputConstraint& c, uint32_t seed, int steps) {
  std::mt19937 rng(seed);
  std::vector<std::vector<uint32_t>> masks;
  const int words = O200kIndex()->words();
  for (int i = 0; i < steps && !c.complete(); ++i) {
    const uint32_t* m = c.Mask();
    masks.emplace_back(m, m + words);
    std::vector<int32_t> allowed;
    for (int32_t t = 0; t < O200kIndex()->vocab().vocab_size; ++t) {
      if (TestBit(m, t)) allowed.push_back(t);
    }
    if (allowed.empty() || !c.Advance(allowed[rng() % allowed.size()]).ok()) break;
  }
  return masks;
}

// The masks of a turn under a fresh constraint of `spec` (Masks: seed 11, at
// most 60 tokens); `complete`: the constraint ended the turn.
std::vector<std::vector<uint32_t>> TurnMasks(const ConstraintSpec& spec, bool* complete) {
  auto c = OutputConstraint::Create(spec, O200kIndex());
  EXPECT_TRUE(c.ok()) << c.status();
  if (!c.ok()) return {};
  std::vector<std::vector<uint32_t>> masks = Masks(**c, 11, 60);
  *complete = (*c)->complete();
  return masks;
}

TEST(GrammarMaskCache, AnotherRequestWithTheSameSchemaReusesMasksAndGetsTheSameOnes) {
  ASSERT_NE(O200kIndex(), nullptr);
  ConstraintSpec spec;
  spec.json_final = true;
  spec.final_schema = R"({"type": "object", "properties": {"mood": {"enum": ["calm", "busy"]},
      "count": {"type": "integer", "minimum": 0, "maximum": 90}}, "required": ["mood", "count"],
      "additionalProperties": false})";
  bool complete = false;
  const std::vector<std::vector<uint32_t>> computed = TurnMasks(spec, &complete);
  ASSERT_TRUE(complete);

  std::shared_ptr<MaskCache> cache = MaskCache::For(O200kIndex());
  const MaskCache::Counts before = cache->counts();
  const std::vector<std::vector<uint32_t>> reused = TurnMasks(spec, &complete);
  const MaskCache::Counts after = cache->counts();
  EXPECT_EQ(reused, computed);  // the same path, the same masks
  EXPECT_EQ(after.misses, before.misses);  // every header and body state was cached
  EXPECT_GE(after.hits - before.hits, computed.size() - 1);

  // Another schema's states are its own: the same bytes lead elsewhere.
  ConstraintSpec narrow = spec;
  narrow.final_schema = R"({"type": "object", "properties": {"mood": {"enum": ["calm"]},
      "count": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["mood", "count"],
      "additionalProperties": false})";
  const std::vector<std::vector<uint32_t>> own = TurnMasks(narrow, &complete);
  ASSERT_TRUE(complete);
  EXPECT_NE(own, computed);
}

}  // namespace
}  // namespace flotilla::grammar
