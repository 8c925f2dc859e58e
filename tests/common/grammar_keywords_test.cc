// The matcher on the JSON Schema keywords clients write beyond the basic
// subset: pattern and format on the decoded value (JSON escapes included),
// oneOf, records (additionalProperties with a schema), tuples (prefixItems),
// multipleOf, minProperties / maxProperties, const / enum of any type. Each
// is checked on byte sequences it must accept or refuse, and by random walks
// (any allowed byte at random) that must never meet a dead end and always
// end in JSON an independent validator accepts.
#include <gtest/gtest.h>

#include <random>

#include "common/grammar/json_matcher.h"
#include "tests/common/grammar_test_util.h"
#include "tests/common/json_schema_validator.h"

namespace flotilla::grammar {
namespace {

using Json = nlohmann::json;

using testing_util::Accepts;
using testing_util::Compiled;
using testing_util::Continues;

TEST(GrammarKeywords, PatternOnTheDecodedValue) {
  CompiledSchema s = Compiled(R"({"type": "string", "pattern": "^[a-c]+\"?\n?$"})");
  EXPECT_TRUE(Accepts(s, R"("abc")"));
  EXPECT_TRUE(Accepts(s, R"("ab\"")"));    // the escape decodes to a quote
  EXPECT_TRUE(Accepts(s, R"("ab\"\n")"));
  EXPECT_FALSE(Accepts(s, R"("ab\\")"));   // a backslash is not in the pattern
  EXPECT_FALSE(Accepts(s, R"("")"));
  EXPECT_FALSE(Accepts(s, R"("abd")"));
  EXPECT_FALSE(Continues(s, R"("\u0061)"));  // with a pattern only short escapes
  EXPECT_FALSE(Continues(s, R"("d)"));        // no completion matches: refused at once
  CompiledSchema both = Compiled(R"({"type": "string", "format": "ends_with",
      "allOf": [{"pattern": "^ab"}, {"pattern": "yz$"}]})");
  EXPECT_TRUE(Accepts(both, R"("ab-xyz")"));
  EXPECT_FALSE(Accepts(both, R"("ab-xy")"));
  // Without `type`, a string keyword makes the value a string.
  CompiledSchema untyped = Compiled(R"({"pattern": "^a$"})");
  EXPECT_TRUE(Accepts(untyped, R"("a")"));
  EXPECT_FALSE(Accepts(untyped, "1"));
  CompiledSchema unanchored = Compiled(R"({"type": "string", "pattern": "x\\d"})");
  EXPECT_TRUE(Accepts(unanchored, R"("before x1 after")"));
  EXPECT_FALSE(Accepts(unanchored, R"("before x after")"));
}

TEST(GrammarKeywords, PatternWithLengthBoundsNeverDeadEnds) {
  // Only lengths 2 and 6 match; maxLength 5 leaves "ab" alone.
  CompiledSchema s = Compiled(R"({"type": "string", "pattern": "^(ab|abcdef)$", "maxLength": 5})");
  EXPECT_TRUE(Accepts(s, R"("ab")"));
  EXPECT_FALSE(Continues(s, R"("abc)"));
  absl::StatusOr<CompiledSchema> none = CompileSchema(
      Json::parse(R"({"type": "string", "pattern": "^(ab|abcdef)$", "minLength": 3, "maxLength": 5})"));
  EXPECT_FALSE(none.ok());
  EXPECT_NE(std::string(none.status().message()).find("pattern"), std::string::npos);
}

TEST(GrammarKeywords, FormatsAndTheirIntersectionWithPattern) {
  CompiledSchema email = Compiled(R"({"type": "string", "format": "email", "maxLength": 12})");
  EXPECT_TRUE(Accepts(email, R"("ab@cd.org")"));
  EXPECT_FALSE(Accepts(email, R"("ab@cd")"));
  EXPECT_FALSE(Accepts(email, R"("abcdef@cd.org")"));  // 13 code points
  // zod's email pattern beside the format: both hold.
  CompiledSchema zod = Compiled(
      R"({"type": "string", "format": "email", "pattern": "^(?!\\.)(?!.*\\.\\.)([A-Za-z0-9_'+\\-\\.]*)[A-Za-z0-9_+-]@([A-Za-z0-9][A-Za-z0-9\\-]*\\.)+[A-Za-z]{2,}$"})");
  EXPECT_TRUE(Accepts(zod, R"("a.b@c.de")"));
  EXPECT_FALSE(Accepts(zod, R"("a!b@c.de")"));  // the format allows '!', the pattern not
  CompiledSchema when = Compiled(R"({"type": "string", "format": "date-time"})");
  EXPECT_TRUE(Accepts(when, R"("2024-02-29T23:59:59.5+01:00")"));
  EXPECT_FALSE(Accepts(when, R"("2023-02-29T23:59:59Z")"));
  CompiledSchema host = Compiled(R"({"type": "string", "format": "hostname"})");
  EXPECT_TRUE(Accepts(host, "\"" + std::string(63, 'a') + ".b\""));
  EXPECT_FALSE(Continues(host, "\"" + std::string(64, 'a')));
}

TEST(GrammarKeywords, OneOfWhoseAlternativesExcludeEachOther) {
  CompiledSchema s = Compiled(R"({"oneOf": [
      {"type": "object", "properties": {"kind": {"const": "a"}, "x": {"type": "integer"}},
       "required": ["kind", "x"]},
      {"type": "object", "properties": {"kind": {"const": "b"}, "y": {"type": "string"}},
       "required": ["kind", "y"]}], "discriminator": {"propertyName": "kind"}})");
  EXPECT_TRUE(Accepts(s, R"({"kind":"a","x":1})"));
  EXPECT_TRUE(Accepts(s, R"({"kind":"b","y":"q"})"));
  EXPECT_FALSE(Accepts(s, R"({"kind":"a","y":"q"})"));
  EXPECT_TRUE(Compiled(R"({"oneOf": [{"type": "string"}, {"type": "integer"}, {"type": "null"}]})")
                  .nodes.size() > 1);
}

TEST(GrammarKeywords, RecordsTuplesAndCounts) {
  CompiledSchema record = Compiled(R"({"type": "object", "propertyNames": {"pattern": "^[a-z]+$"},
      "additionalProperties": {"type": "integer"}, "maxProperties": 2})");
  EXPECT_TRUE(Accepts(record, R"({})"));
  EXPECT_TRUE(Accepts(record, R"({"ab":1,"c":2})"));
  EXPECT_FALSE(Accepts(record, R"({"ab":1,"c":2,"d":3})"));
  EXPECT_FALSE(Accepts(record, R"({"A":1})"));
  EXPECT_FALSE(Accepts(record, R"({"a":"x"})"));
  CompiledSchema named = Compiled(R"({"type": "object", "propertyNames": {"enum": ["x", "y"]},
      "additionalProperties": {"type": "boolean"}})");
  EXPECT_TRUE(Accepts(named, R"({"x":true,"y":false})"));
  EXPECT_FALSE(Accepts(named, R"({"x":true,"x":false})"));
  EXPECT_FALSE(Accepts(named, R"({"z":true})"));
  CompiledSchema tuple = Compiled(R"({"type": "array", "prefixItems": [{"type": "string"},
      {"type": "integer"}], "items": {"type": "boolean"}, "maxItems": 3})");
  EXPECT_TRUE(Accepts(tuple, R"(["a",1,true])"));
  EXPECT_TRUE(Accepts(tuple, R"(["a"])"));
  EXPECT_FALSE(Accepts(tuple, R"([1,"a"])"));
  EXPECT_FALSE(Accepts(tuple, R"(["a",1,2])"));
  CompiledSchema closed = Compiled(R"({"type": "array", "prefixItems": [{"type": "null"}]})");
  EXPECT_FALSE(Accepts(closed, R"([null,null])"));  // no items past the tuple are generated
  CompiledSchema counted = Compiled(R"({"type": "object", "properties": {"a": {"type": "null"},
      "b": {"type": "null"}, "c": {"type": "null"}}, "required": ["c"],
      "minProperties": 2, "maxProperties": 2})");
  EXPECT_TRUE(Accepts(counted, R"({"a":null,"c":null})"));
  EXPECT_TRUE(Accepts(counted, R"({"b":null,"c":null})"));
  EXPECT_FALSE(Accepts(counted, R"({"c":null})"));
  EXPECT_FALSE(Continues(counted, R"({"a":null,"b")"));  // c could no longer fit
}

TEST(GrammarKeywords, MultipleOfIsExact) {
  CompiledSchema s = Compiled(R"({"type": "integer", "multipleOf": 7, "minimum": -30, "maximum": 30})");
  for (int v = -60; v <= 60; ++v) {
    EXPECT_EQ(Accepts(s, std::to_string(v)), v % 7 == 0 && v >= -30 && v <= 30) << v;
  }
  // A number with a whole multipleOf is written as an integer.
  CompiledSchema n = Compiled(R"({"type": "number", "multipleOf": 5, "exclusiveMaximum": 10})");
  EXPECT_TRUE(Accepts(n, "5"));
  EXPECT_FALSE(Accepts(n, "10"));
  EXPECT_FALSE(Accepts(n, "5.0"));
}

TEST(GrammarKeywords, ConstAndEnumOfAnyType) {
  CompiledSchema s = Compiled(R"({"enum": [{"a": [1, null]}, [true], 2.5, null, "x"]})");
  EXPECT_TRUE(Accepts(s, R"({"a":[1,null]})"));
  EXPECT_TRUE(Accepts(s, R"([true])"));
  EXPECT_TRUE(Accepts(s, "2.5"));
  EXPECT_FALSE(Accepts(s, "2"));
  CompiledSchema typed = Compiled(R"({"type": "string", "enum": ["a", 1, null]})");
  EXPECT_TRUE(Accepts(typed, R"("a")"));
  EXPECT_FALSE(Accepts(typed, "1"));  // not a string
  // Keywords beside an enum hold too: values that break them are never written.
  CompiledSchema beside = Compiled(R"({"type": "string", "enum": ["a", "bb", "c1"],
      "maxLength": 1})");
  EXPECT_TRUE(Accepts(beside, R"("a")"));
  EXPECT_FALSE(Accepts(beside, R"("bb")"));
  CompiledSchema patterned = Compiled(R"({"enum": ["a", "bb", "c1"], "pattern": "\\d"})");
  EXPECT_TRUE(Accepts(patterned, R"("c1")"));
  EXPECT_FALSE(Accepts(patterned, R"("a")"));
  CompiledSchema bounded = Compiled(R"({"type": "integer", "enum": [1, 5, 10], "multipleOf": 5,
      "maximum": 9})");
  EXPECT_TRUE(Accepts(bounded, "5"));
  EXPECT_FALSE(Accepts(bounded, "10"));
  EXPECT_FALSE(Accepts(bounded, "1"));
  EXPECT_FALSE(CompileSchema(Json::parse(R"({"const": "abc", "maxLength": 2})")).ok());
}

TEST(GrammarKeywords, RandomWalksNeverDeadEndAndValidate) {
  const char* schemas[] = {
      R"({"type": "object", "properties": {
          "code": {"type": "string", "pattern": "^[A-Z]{2}-\\d{3,4}$"},
          "note": {"type": "string", "pattern": "^[a-z\"\\\\ ]{0,6}$"},
          "n": {"type": "integer", "multipleOf": 3, "minimum": -10, "maximum": 40},
          "pair": {"type": "array", "prefixItems": [{"type": "boolean"}, {"enum": ["p", 2]}]}},
          "required": ["code", "note", "n", "pair"], "additionalProperties": false})",
      R"({"type": "object", "propertyNames": {"type": "string", "pattern": "^k[0-9]$"},
          "additionalProperties": {"oneOf": [{"type": "string", "maxLength": 2}, {"type": "null"}]},
          "minProperties": 1, "maxProperties": 3})",
      R"({"type": "object", "properties": {"a": {"type": "null"}, "b": {"type": "null"},
          "c": {"type": "null"}, "d": {"type": "null"}}, "required": ["b"],
          "minProperties": 2, "maxProperties": 3, "additionalProperties": false})",
      R"({"type": "string", "pattern": "^(ab|abcdef)+$", "minLength": 4, "maxLength": 9})",
  };
  std::mt19937 rng(5);
  for (const char* text : schemas) testing_util::ExpectWalksValidate(text, rng, 150, 4);
}

}  // namespace
}  // namespace flotilla::grammar
