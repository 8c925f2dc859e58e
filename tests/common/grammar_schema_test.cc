// The schema compiler: what it accepts, and that every unsupported feature
// is refused with its name (never ignored).
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

#include "common/grammar/schema.h"

namespace flotilla::grammar {
namespace {

using Json = nlohmann::json;

absl::Status Compile(const char* text) { return CompileSchema(Json::parse(text)).status(); }

TEST(GrammarSchema, AcceptsTheSupportedSubset) {
  EXPECT_TRUE(Compile(R"({"type": "object", "properties": {
      "name": {"type": "string", "minLength": 1, "maxLength": 8, "description": "who"},
      "age": {"type": "integer", "minimum": 0, "maximum": 150},
      "score": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
      "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
      "pet": {"anyOf": [{"$ref": "#/$defs/pet"}, {"type": "null"}]},
      "nick": {"type": ["string", "null"]},
      "ok": {"type": "boolean", "nullable": true},
      "kind": {"const": "person"}},
    "required": ["name", "age"], "additionalProperties": false,
    "$defs": {"pet": {"type": "object", "properties": {"legs": {"type": "integer"}}}}})")
                  .ok());
}

TEST(GrammarSchema, RefusesUnsupportedFeaturesByName) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"type": "string", "pattern": "(a)\\1"})", "pattern: unsupported backreference"},
      {R"({"type": "string", "format": "duration"})", "unsupported format 'duration'"},
      {R"({"type": "string", "format": "time", "pattern": "^\\d\\d:\\d\\d$"})",
       "no string matches both"},
      {R"({"type": "integer", "format": "int32"})", "'format' on a integer"},
      {R"({"oneOf": [{"type": "string"}, {"type": "string", "maxLength": 2}]})",
       "oneOf: alternatives 0 and 1 may both match"},
      {R"({"oneOf": [{"type": "integer"}, {"type": "number"}]})", "alternatives 0 and 1"},
      {R"({"allOf": [{"type": "string"}]})", "allOf"},
      {R"({"type": "number", "multipleOf": 0.5})", "multipleOf"},
      {R"({"type": "object", "additionalProperties": {"type": "integer"}, "minProperties": 2})",
       "minProperties"},
      {R"({"type": "object", "properties": {"a": {"type": "null"}}, "minProperties": 2})",
       "minProperties"},
      {R"({"type": "object", "properties": {"a": {"type": "null"}, "b": {"type": "null"}},
          "required": ["a", "b"], "maxProperties": 1})", "maxProperties"},
      {R"({"type": "object", "properties": {"a": {"type": "null"}}, "propertyNames": {"maxLength": 3}})",
       "propertyNames"},
      {R"({"type": "object", "additionalProperties": {"type": "null"}, "propertyNames": {"type": "integer"}})",
       "propertyNames"},
      {R"({"type": "array", "prefixItems": [{"type": "null"}], "items": false, "minItems": 2})",
       "minItems"},
      {R"({"minLength": 1, "minimum": 0})", "keywords of several types"},
      {R"({"type": "string", "pattern": "^(?=a)(?=a)(?=a)(?=a)(?=a)(?=a)(?=a)(?=a)(?=a)a$"})",
       "lookaheads"},
      {R"({"type": "string", "pattern": "^[ab]*a[ab]{15}$"})", "automaton states"},
      {R"({"type": "object", "properties": {"a": {"type": "array", "uniqueItems": true}}})",
       "uniqueItems"},
      {R"({"type": "object", "patternProperties": {}})", "patternProperties"},
      // Alternatives that begin alike are read side by side, at most 4 at once.
      {R"({"anyOf": [{"type": "object"}, {"type": "object"}, {"type": "object"},
          {"type": "object"}, {"type": "object"}]})", "alternatives"},
      {R"({"anyOf": [{"type": "array", "items": {"$ref": "#"}},
          {"type": "array", "items": {"type": "integer"}}]})", "alternatives"},
      {R"({"$ref": "https://example.com/x"})", "$ref"},
      {R"({"type": "object", "required": ["x"]})", "required"},
      {R"({"type": "date"})", "unknown type"},
  };
  for (const auto& [schema, name] : cases) {
    absl::Status st = Compile(schema);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << schema;
    EXPECT_NE(std::string(st.message()).find(name), std::string::npos)
        << schema << " -> " << st.message();
  }
}

// $ref chains are bounded like nesting (each reference compiles its target
// once, inside the same depth count), and cycles end at the first repeat.
// What clients write: formats and patterns, oneOf whose alternatives exclude
// each other (types, discriminators, closed objects), records, tuples,
// multipleOf, property counts, additionalProperties true.
TEST(GrammarSchema, AcceptsWhatClientsWrite) {
  for (const char* schema : {
           R"({"type": "string", "format": "email", "pattern": "^[a-z@.]+$", "maxLength": 40})",
           R"({"type": "string", "format": "uri", "minLength": 1, "maxLength": 2083})",
           R"({"oneOf": [{"type": "string"}, {"type": "integer"}, {"type": "null"}]})",
           R"({"oneOf": [{"$ref": "#/$defs/a"}, {"$ref": "#/$defs/b"}],
               "discriminator": {"propertyName": "t"},
               "$defs": {"a": {"type": "object", "properties": {"t": {"const": "a"}}, "required": ["t"]},
                         "b": {"type": "object", "properties": {"t": {"enum": ["b", "c"]}}, "required": ["t"]}}})",
           R"({"oneOf": [{"type": "object", "properties": {"x": {"type": "null"}}, "required": ["x"],
               "additionalProperties": false}, {"type": "object", "properties": {"y": {"type": "null"}},
               "required": ["y"], "additionalProperties": false}]})",
           R"({"type": "object", "additionalProperties": {"type": "number"}, "propertyNames": {"type": "string"}})",
           R"({"type": "array", "prefixItems": [{"type": "string"}, {"type": "number"}], "items": false})",
           R"({"type": "integer", "multipleOf": 5, "minimum": -9007199254740991, "maximum": 9007199254740991})",
           R"({"type": "object", "properties": {"a": {"type": "null"}}, "additionalProperties": true,
               "minProperties": 1, "maxProperties": 1})",
           // zod's startsWith + endsWith; pydantic's recursive root model.
           R"({"type": "string", "format": "ends_with", "allOf": [{"pattern": "^ab.*"}, {"pattern": ".*yz$"}]})",
           R"({"$ref": "#/$defs/Node", "$defs": {"Node": {"type": "object", "properties": {
               "v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/Node"}}},
               "required": ["v"]}}})",
       }) {
    EXPECT_TRUE(Compile(schema).ok()) << schema << " -> " << Compile(schema);
  }
}

TEST(GrammarSchema, LongRefChainsAreRefusedAndCyclesCompile) {
  nlohmann::json chain = {{"type", "object"},
                          {"properties", {{"x", {{"$ref", "#/$defs/d0"}}}}},
                          {"$defs", nlohmann::json::object()}};
  for (int i = 0; i < 500; ++i) {
    chain["$defs"][absl::StrCat("d", i)] = {{"$ref", absl::StrCat("#/$defs/d", i + 1)}};
  }
  chain["$defs"]["d500"] = {{"type", "integer"}};
  const std::string text = chain.dump();
  absl::Status st = Compile(text.c_str());
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(st.message()).find("nested too deeply"), std::string::npos) << st;
  absl::Status cycle = Compile(R"({"type": "object", "properties": {"x": {"$ref": "#/$defs/a"}},
      "$defs": {"a": {"anyOf": [{"type": "null"},
      {"type": "object", "properties": {"next": {"$ref": "#/$defs/b"}}}]},
      "b": {"$ref": "#/$defs/a"}}})");
  EXPECT_TRUE(cycle.ok()) << cycle;
}

TEST(GrammarSchema, AcceptsAlternativesThatBeginAlike) {
  for (const char* schema : {
           R"({"type": ["integer", "number"]})",
           R"({"anyOf": [{"type": "object", "properties": {"a": {"type": "string"}}},
               {"type": "object", "properties": {"b": {"type": "integer"}}}]})",
           R"({"anyOf": [{"type": "string", "maxLength": 3}, {"enum": ["long value", 7]}]})",
           R"({"type": "array", "items": {"anyOf": [{"type": "integer"}, {"type": "number"},
               {"type": "null"}]}})",
       }) {
    EXPECT_TRUE(Compile(schema).ok()) << schema << " -> " << Compile(schema);
  }
}

// Unions of unions under oneOf could make the disjointness check branch
// exponentially: it stops after a bounded number of steps (and refuses).
TEST(GrammarSchema, OneOfCheckIsBounded) {
  nlohmann::json nested = {{"type", "string"}};
  for (int level = 0; level < 7; ++level) {
    nested = {{"anyOf", nlohmann::json::array({nested, nested, nested, nested})}};
  }
  nlohmann::json schema = {{"oneOf", nlohmann::json::array({nested, nested})}};
  absl::Status st = CompileSchema(schema).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
}

TEST(GrammarSchema, ErrorsSayWhere) {
  absl::Status st = Compile(R"({"type": "object", "properties": {"a": {"type": "string", "format": "ean"}}})");
  EXPECT_NE(std::string(st.message()).find("#/properties/a"), std::string::npos) << st.message();
  absl::Status one = Compile(R"({"type": "object", "properties": {"b": {"oneOf": [{"type": "string"},
      {"type": "string"}]}}})");
  EXPECT_NE(std::string(one.message()).find("#/properties/b/oneOf"), std::string::npos) << one;
}

}  // namespace
}  // namespace flotilla::grammar
