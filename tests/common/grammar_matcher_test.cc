// The byte-level JSON matcher: documents it accepts and refuses, and random
// walks through it (any allowed byte, at random) that always end in JSON an
// independent validator accepts.
#include <gtest/gtest.h>

#include <random>

#include "common/grammar/json_matcher.h"
#include "tests/common/grammar_test_util.h"
#include "tests/common/json_schema_validator.h"

namespace flotilla::grammar {
namespace {

using Json = nlohmann::json;
using OrderedJson = nlohmann::ordered_json;

using testing_util::Accepts;
using testing_util::Compiled;

bool Valid(const Json& schema, const Json& v, const Json& root) {
  return schema_check::SchemaValid(schema, v, root);
}

TEST(GrammarMatcher, ObjectsInOrderWithRequiredFields) {
  CompiledSchema s = Compiled(R"({"type": "object", "properties": {
      "a": {"type": "integer"}, "b": {"type": "string"}, "c": {"type": "boolean"}},
      "required": ["b"], "additionalProperties": false})");
  EXPECT_TRUE(Accepts(s, R"({"a":1,"b":"x","c":true})"));
  EXPECT_TRUE(Accepts(s, R"({"b":"x"})"));
  EXPECT_FALSE(Accepts(s, R"({"a":1})"));           // b is required
  EXPECT_FALSE(Accepts(s, R"({"b":"x","a":1})"));   // declared order
  EXPECT_FALSE(Accepts(s, R"({"b":"x","d":1})"));   // undeclared
  EXPECT_FALSE(Accepts(s, R"({"b": "x"})"));        // compact: no whitespace
  EXPECT_FALSE(Accepts(s, R"({"b":"x"} )"));
}

// Declared order is the schema's own, not alphabetical (OpenAI's strict
// outputs keep it): "country" before "capital".
TEST(GrammarMatcher, PropertiesComeInTheSchemasOrderNotSorted) {
  CompiledSchema s = Compiled(R"({"type": "object", "properties": {
      "country": {"type": "string"}, "capital": {"type": "string"}},
      "required": ["country", "capital"], "additionalProperties": false})");
  EXPECT_TRUE(Accepts(s, R"({"country":"France","capital":"Paris"})"));
  EXPECT_FALSE(Accepts(s, R"({"capital":"Paris","country":"France"})"));
}

TEST(GrammarMatcher, NumberBoundsAreExact) {
  CompiledSchema s = Compiled(R"({"type": "integer", "minimum": -5, "maximum": 120})");
  for (int v = -20; v <= 200; ++v) {
    EXPECT_EQ(Accepts(s, std::to_string(v)), v >= -5 && v <= 120) << v;
  }
  EXPECT_FALSE(Accepts(s, "007"));
  EXPECT_FALSE(Accepts(s, "1.5"));
  CompiledSchema x = Compiled(R"({"type": "number", "exclusiveMinimum": 0, "maximum": 1})");
  EXPECT_TRUE(Accepts(x, "0.25"));
  EXPECT_TRUE(Accepts(x, "1"));
  EXPECT_FALSE(Accepts(x, "0"));
  EXPECT_FALSE(Accepts(x, "1.01"));
  EXPECT_FALSE(Accepts(x, "-0.5"));
}

TEST(GrammarMatcher, StringsLengthsUtf8AndEscapes) {
  CompiledSchema s = Compiled(R"({"type": "string", "minLength": 2, "maxLength": 3})");
  EXPECT_TRUE(Accepts(s, "\"ab\""));
  EXPECT_TRUE(Accepts(s, "\"\xC3\xA9t\xC3\xA9\""));  // 3 code points, 6 bytes
  EXPECT_FALSE(Accepts(s, "\"a\""));
  EXPECT_FALSE(Accepts(s, "\"abcd\""));
  EXPECT_TRUE(Accepts(s, "\"a\\n\""));
  EXPECT_TRUE(Accepts(s, "\"\\u00e9x\""));
  EXPECT_FALSE(Accepts(s, "\"\\ud800x\""));   // lone surrogate
  EXPECT_FALSE(Accepts(s, "\"a\xC3\""));       // cut UTF-8
  EXPECT_FALSE(Accepts(s, "\"a\x01\""));       // raw control character
}

TEST(GrammarMatcher, EnumsUnionsAndRefs) {
  CompiledSchema s = Compiled(R"({"type": "object", "properties": {
      "e": {"enum": ["red", "green", 1, 12, null]},
      "n": {"type": ["integer", "null"]},
      "t": {"$ref": "#/$defs/tree"}}, "additionalProperties": false,
      "$defs": {"tree": {"type": "object", "properties": {
          "kids": {"type": "array", "items": {"$ref": "#/$defs/tree"}}}}}})");
  EXPECT_TRUE(Accepts(s, R"({"e":"green"})"));
  EXPECT_TRUE(Accepts(s, R"({"e":1})"));
  EXPECT_TRUE(Accepts(s, R"({"e":12})"));
  EXPECT_FALSE(Accepts(s, R"({"e":2})"));
  EXPECT_FALSE(Accepts(s, R"({"e":"blue"})"));
  EXPECT_TRUE(Accepts(s, R"({"n":null})"));
  EXPECT_TRUE(Accepts(s, R"({"n":-3})"));
  EXPECT_TRUE(Accepts(s, R"({"t":{"kids":[{},{"kids":[]}]}})"));
  EXPECT_FALSE(Accepts(s, R"({"t":{"kids":[1]}})"));
}

TEST(GrammarMatcher, AnyObject) {
  CompiledSchema s = AnyObjectSchema();
  EXPECT_TRUE(Accepts(s, R"({"a":[1,-2.5,"x",{"b":null}],"c":true})"));
  EXPECT_TRUE(Accepts(s, "{}"));
  EXPECT_FALSE(Accepts(s, "[1]"));
  EXPECT_FALSE(Accepts(s, "\"x\""));
}

// Random walks: at each step a random byte among those the matcher accepts
// (closing bytes favoured so walks end); every finished walk must parse and
// validate.
TEST(GrammarMatcher, RandomWalksAlwaysValidate) {
  const char* schemas[] = {
      R"({"type": "object", "properties": {"name": {"type": "string", "maxLength": 6},
          "age": {"type": "integer", "minimum": 18, "maximum": 99},
          "tags": {"type": "array", "items": {"enum": ["a", "bb", "c"]}, "minItems": 1, "maxItems": 3},
          "score": {"type": ["number", "null"], "minimum": -1.5, "maximum": 2.25}},
          "required": ["name", "age", "tags", "score"], "additionalProperties": false})",
      R"({"type": "object", "properties": {"p": {"type": "object", "properties": {
          "x": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
          "ok": {"type": "boolean"}}, "required": ["x", "ok"], "additionalProperties": false},
          "list": {"type": "array", "maxItems": 2, "items": {"type": "object", "properties": {
          "id": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["id"],
          "additionalProperties": false}}}, "required": ["p", "list"], "additionalProperties": false})",
  };
  std::mt19937 rng(7);
  for (const char* text : schemas) testing_util::ExpectWalksValidate(text, rng, 200, 0);
}

// A random document the matcher of `schema` accepts, or a walk cut short.
std::string RandomDocument(const CompiledSchema& schema, std::mt19937& rng) {
  return testing_util::RandomWalk(schema, rng, 3).doc;
}

// anyOf alternatives that begin with the same byte (two objects, integer and
// number, a string and a string enum, nested and in arrays) are followed
// side by side: every document any alternative accepts is accepted, and
// every accepted document validates against the whole schema.
TEST(GrammarMatcher, AlternativesThatBeginAlikeAreReadJointly) {
  const char* unions[] = {
      R"({"anyOf": [{"type": "object", "properties": {"a": {"type": "string", "maxLength": 3}},
          "required": ["a"]}, {"type": "object", "properties": {"a": {"type": "integer"},
          "b": {"type": "boolean"}}, "required": ["b"]}]})",
      R"({"type": ["integer", "number"], "minimum": -3, "maximum": 50})",
      R"({"anyOf": [{"type": "integer", "minimum": 10, "maximum": 20},
          {"type": "number", "minimum": 0, "maximum": 1}]})",
      R"({"anyOf": [{"type": "string", "maxLength": 2}, {"enum": ["abcdef", "xyz", 3]}]})",
      R"({"type": "array", "maxItems": 4, "items": {"anyOf": [{"type": "integer", "minimum": 0,
          "maximum": 9}, {"type": "number", "minimum": -1, "maximum": 0}, {"type": "null"}]}})",
      R"({"anyOf": [{"$ref": "#/$defs/point"}, {"type": "object", "properties": {
          "x": {"type": "integer", "minimum": 0, "maximum": 5}, "label": {"enum": ["p", "q"]}},
          "required": ["x", "label"]}, {"type": "null"}],
          "$defs": {"point": {"type": "object", "properties": {"x": {"type": "number",
          "minimum": -1, "maximum": 1}, "y": {"type": "number"}}, "required": ["x", "y"]}}})",
  };
  std::mt19937 rng(11);
  for (const char* text : unions) {
    // Ordered, as the server compiles a request's schema (declared order).
    const OrderedJson schema = OrderedJson::parse(text);
    CompiledSchema whole = Compiled(text);
    // The alternatives alone (a type list: one schema per type).
    std::vector<OrderedJson> alternatives;
    if (schema.contains("anyOf")) {
      for (const OrderedJson& a : schema["anyOf"]) {
        // A one-member anyOf may carry the $defs its alternative refers to.
        OrderedJson alone = {{"anyOf", OrderedJson::array({a})}};
        if (schema.contains("$defs")) alone["$defs"] = schema["$defs"];
        alternatives.push_back(alone);
      }
    } else if (schema["type"].is_array()) {
      for (const OrderedJson& t : schema["type"]) {
        OrderedJson one = schema;
        one["type"] = t;
        alternatives.push_back(one);
      }
    } else {
      alternatives.push_back(schema);
    }
    for (const OrderedJson& alternative : alternatives) {
      absl::StatusOr<CompiledSchema> alone = CompileSchema(alternative);
      ASSERT_TRUE(alone.ok()) << alone.status();
      for (int walk = 0; walk < 150; ++walk) {
        const std::string doc = RandomDocument(*alone, rng);
        if (!Accepts(*alone, doc)) continue;  // a walk cut short
        EXPECT_TRUE(Accepts(whole, doc)) << text << " refuses " << doc;
      }
    }
    for (int walk = 0; walk < 300; ++walk) {
      const std::string doc = RandomDocument(whole, rng);
      if (!Accepts(whole, doc)) continue;
      const Json v = Json::parse(doc, nullptr, false);
      ASSERT_FALSE(v.is_discarded()) << doc;
      EXPECT_TRUE(Valid(schema, v, schema)) << text << " accepts " << doc;
    }
  }
}

TEST(GrammarMatcher, AlternativesThatBeginAlikeExamples) {
  CompiledSchema objects = Compiled(R"({"anyOf": [
      {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]},
      {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "boolean"}},
       "required": ["b"]}]})");
  EXPECT_TRUE(Accepts(objects, R"({"a":"x"})"));
  EXPECT_TRUE(Accepts(objects, R"({"a":1,"b":true})"));
  EXPECT_TRUE(Accepts(objects, R"({"b":false})"));
  EXPECT_FALSE(Accepts(objects, R"({"a":1})"));          // the second needs b
  EXPECT_FALSE(Accepts(objects, R"({"a":"x","b":true})"));  // the first has no b
  EXPECT_FALSE(Accepts(objects, R"({})"));

  CompiledSchema numbers = Compiled(R"({"anyOf": [{"type": "integer", "minimum": 10,
      "maximum": 20}, {"type": "number", "minimum": 0, "maximum": 1}]})");
  EXPECT_TRUE(Accepts(numbers, "15"));
  EXPECT_TRUE(Accepts(numbers, "0.5"));
  EXPECT_TRUE(Accepts(numbers, "1"));
  EXPECT_FALSE(Accepts(numbers, "1.5"));
  EXPECT_FALSE(Accepts(numbers, "15.5"));
  EXPECT_FALSE(Accepts(numbers, "5"));

  CompiledSchema strings = Compiled(
      R"({"anyOf": [{"type": "string", "maxLength": 2}, {"enum": ["abcdef", 3]}]})");
  EXPECT_TRUE(Accepts(strings, R"("ab")"));
  EXPECT_TRUE(Accepts(strings, R"("abcdef")"));
  EXPECT_TRUE(Accepts(strings, "3"));
  EXPECT_FALSE(Accepts(strings, R"("abc")"));
  EXPECT_FALSE(Accepts(strings, R"("abcdefg")"));

  // Readings that end alike merge: a long array of integer-or-number items
  // stays one reading between items.
  CompiledSchema list = Compiled(
      R"({"type": "array", "items": {"type": ["integer", "number"]}})");
  JsonMatcher m(&list);
  MatchState st = m.Start();
  for (char c : std::string("[1,2.5,3,4,")) ASSERT_TRUE(m.Feed(st, static_cast<uint8_t>(c)));
  EXPECT_EQ(st.count, 1);
  ASSERT_TRUE(m.Feed(st, '7'));
  EXPECT_EQ(st.count, 2);
}

}  // namespace
}  // namespace flotilla::grammar
