// JSON Schema -> a compiled tree of value nodes that JsonMatcher walks byte by
// byte. Only what the matcher enforces is accepted: every keyword it does not
// enforce is refused (INVALID_ARGUMENT naming the keyword and where it is),
// never ignored. Annotations (title, description, default, examples,
// $schema, $id, $comment) constrain nothing and are accepted.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "common/grammar/byte_dfa.h"

namespace flotilla::grammar {

enum class NodeKind : uint8_t {
  kAny,      // any JSON value (json_object mode's members)
  kObject,   // declared properties in declared order, no others
  kArray,
  kString,
  kInteger,
  kNumber,
  kBoolean,
  kNull,
  kLiteral,  // enum / const: one of `literals` (compact JSON texts)
  kUnion,    // anyOf / type lists / $ref: any of `alternatives`
};

struct Property {
  std::string key_text;  // `"name":` exactly as it is written (JSON-escaped)
  int node = -1;
  bool required = false;
};

// A string's `pattern` and `format` as one automaton over the decoded bytes
// of its value, with the length bounds it must hold at the same time.
struct TextConstraint {
  ByteDfa dfa;
  LengthTable lengths;
  // minLength / maxLength narrowed by a pattern's length lookahead (the
  // node's own bounds are set to these).
  int64_t min_length = 0, max_length = -1;
};

struct SchemaNode {
  NodeKind kind = NodeKind::kAny;
  std::vector<Property> properties;  // kObject, at most 64
  // kObject without declared properties whose additionalProperties is a
  // schema (a record): any keys of `key_node` (a string or string literal
  // node: propertyNames) with values of `value_node`; -1 otherwise.
  int key_node = -1, value_node = -1;
  int64_t min_properties = 0, max_properties = -1;  // kObject
  int items = -1;                    // kArray: the item node after prefix_items
  std::vector<int> prefix_items;     // kArray: the first items' nodes (a tuple)
  int64_t min_items = 0, max_items = -1;
  int64_t min_length = 0, max_length = -1;  // kString, in code points
  std::shared_ptr<const TextConstraint> text;  // kString: pattern / format, or null
  // kInteger / kNumber: value bounds (exclusive ones keep their flag).
  std::optional<double> minimum, maximum;
  bool exclusive_minimum = false, exclusive_maximum = false;
  int64_t multiple_of = 0;           // kInteger: 0 or a positive whole multipleOf
  std::vector<std::string> literals;  // kLiteral, at most 64
  std::vector<int> alternatives;      // kUnion
  bool object_only = false;           // kAny: only an object (json_object's root)
};

// Nodes of one schema; node 0 is the root. Immutable once compiled.
struct CompiledSchema {
  std::vector<SchemaNode> nodes;
  int root = 0;
};

// Largest number of integer digits and of fraction digits a generated number
// has (within double precision, so bounds are checked exactly).
inline constexpr int kMaxIntegerDigits = 15;
inline constexpr int kMaxFractionDigits = 6;
inline constexpr int kMaxNesting = 24;
// Most readings the matcher follows at once: anyOf alternatives that share a
// first byte are followed side by side; schemas that could need more (five
// object alternatives, or such unions nested in each other) are refused.
inline constexpr int kMaxJointReadings = 4;
// States of one string's pattern/format automaton, and the states x lengths
// its length bounds may track.
inline constexpr int kMaxTextStates = 2048;
inline constexpr int64_t kMaxLengthBits = int64_t{1} << 22;

// `schema`: a JSON Schema object (strict subset, see the README).
absl::StatusOr<CompiledSchema> CompileSchema(const nlohmann::ordered_json& schema);
// Any JSON object (response_format json_object).
CompiledSchema AnyObjectSchema();

}  // namespace flotilla::grammar
