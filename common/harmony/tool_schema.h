// JSON Schema of a tool's parameters -> the TypeScript-like type gpt-oss reads
// in a Harmony tool namespace.
//
// The rendering follows openai-harmony's reference renderer rule for rule (see
// README.md, "Tool schemas"): the same comments, indentation, default and
// nullable forms, and `any` wherever the reference writes `any`. Two things
// happen before rendering, because the reference sees neither: local `$ref`s
// are replaced by the schemas they point to, and an `anyOf` on a schema with
// no `type` and no `oneOf` is read as a `oneOf` (one line and comment per
// variant), so the model sees the shape instead of `any`.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"

namespace flotilla::harmony {

// Checks a parameters schema and returns it ready for rendering ($refs
// inlined, anyOf read as oneOf). InvalidArgument names the field below `where`
// for a malformed schema: a non-object schema, `properties` or `required` of
// the wrong shape, an unknown type name, an empty enum / oneOf / anyOf, a
// `$ref` that does not resolve, or nesting deeper than 32 levels.
absl::StatusOr<nlohmann::ordered_json> PrepareToolSchema(const nlohmann::ordered_json& schema,
                                                         const std::string& where);

// The TypeScript-like type of a prepared schema, every line after the first
// starting with `indent` where the reference puts it.
std::string SchemaToTypeScript(const nlohmann::ordered_json& schema, const std::string& indent);

// `text` split into lines the way the reference splits descriptions: at '\n',
// a trailing '\r' dropped from each line, no line after a final '\n'.
std::vector<std::string> DescriptionLines(const std::string& text);

}  // namespace flotilla::harmony
