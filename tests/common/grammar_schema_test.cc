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
      {R"({"type": "string", "pattern": "^a"})", "pattern"},
      {R"({"type": "string", "format": "date"})", "format"},
      {R"({"oneOf": [{"type": "string"}]})", "oneOf"},
      {R"({"allOf": [{"type": "string"}]})", "allOf"},
      {R"({"type": "integer", "multipleOf": 2})", "multipleOf"},
      {R"({"type": "object", "additionalProperties": true})", "additionalProperties"},
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

TEST(GrammarSchema, ErrorsSayWhere) {
  absl::Status st = Compile(R"({"type": "object", "properties": {"a": {"type": "string", "format": "email"}}})");
  EXPECT_NE(std::string(st.message()).find("#/properties/a"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace flotilla::grammar
