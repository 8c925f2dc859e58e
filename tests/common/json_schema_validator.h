// A validator of the JSON Schema subset that structured outputs support,
// written from the JSON Schema rules (independently of the matcher), for
// tests that check generated JSON against its schema.
#pragma once

#include <cmath>
#include <regex>
#include <string>

#include <nlohmann/json.hpp>

namespace flotilla::schema_check {

// Whether `v` conforms to `schema`; `root` resolves `#/$defs/NAME` references.
inline bool SchemaValid(const nlohmann::json& schema, const nlohmann::json& v,
                        const nlohmann::json& root) {
  using Json = nlohmann::json;
  if (schema.contains("$ref")) {
    const std::string ref = schema["$ref"];
    return SchemaValid(root["$defs"][ref.substr(ref.rfind('/') + 1)], v, root);
  }
  if (schema.value("nullable", false) && v.is_null()) return true;
  if (schema.contains("anyOf")) {
    for (const Json& a : schema["anyOf"]) if (SchemaValid(a, v, root)) return true;
    return false;
  }
  if (schema.contains("oneOf")) {  // exactly one
    int matched = 0;
    for (const Json& a : schema["oneOf"]) matched += SchemaValid(a, v, root) ? 1 : 0;
    return matched == 1;
  }
  if (schema.contains("const")) return v == schema["const"];
  if (schema.contains("enum")) {
    for (const Json& e : schema["enum"]) if (e == v) return true;
    return false;
  }
  if (schema.contains("type") && schema["type"].is_array()) {
    for (const Json& t : schema["type"]) {
      Json one = schema;
      one["type"] = t;
      if (SchemaValid(one, v, root)) return true;
    }
    return false;
  }
  const std::string type = schema.value("type", "");
  auto bounded = [&](double x) {
    if (schema.contains("minimum") && x < schema["minimum"].get<double>()) return false;
    if (schema.contains("maximum") && x > schema["maximum"].get<double>()) return false;
    if (schema.contains("exclusiveMinimum") && x <= schema["exclusiveMinimum"].get<double>()) return false;
    if (schema.contains("exclusiveMaximum") && x >= schema["exclusiveMaximum"].get<double>()) return false;
    return true;
  };
  if (type == "object") {
    if (!v.is_object()) return false;
    for (const Json& r : schema.value("required", Json::array())) if (!v.contains(r)) return false;
    if (v.size() < schema.value("minProperties", 0u) ||
        v.size() > schema.value("maxProperties", 1000000u)) {
      return false;
    }
    const Json props = schema.value("properties", Json::object());
    const Json extra = schema.value("additionalProperties", Json(true));
    for (const auto& [k, x] : v.items()) {
      if (props.contains(k)) {
        if (!SchemaValid(props[k], x, root)) return false;
        continue;
      }
      if (extra == Json(false) || (extra.is_object() && !SchemaValid(extra, x, root))) return false;
      if (schema.contains("propertyNames") && !SchemaValid(schema["propertyNames"], k, root)) {
        return false;
      }
    }
    return true;
  }
  if (type == "array") {
    if (!v.is_array()) return false;
    if (v.size() < schema.value("minItems", 0u) || v.size() > schema.value("maxItems", 1000000u)) return false;
    const Json prefix = schema.value("prefixItems", Json::array());
    for (size_t i = 0; i < v.size(); ++i) {
      const Json& item_schema = i < prefix.size() ? prefix[i] : schema.value("items", Json(true));
      if (item_schema == Json(false)) return false;
      if (item_schema.is_object() && !SchemaValid(item_schema, v[i], root)) return false;
    }
    return true;
  }
  if (type == "string") {
    if (!v.is_string()) return false;
    size_t points = 0;
    for (unsigned char c : v.get<std::string>()) points += (c & 0xC0) != 0x80;
    if (schema.contains("pattern") &&
        !std::regex_search(v.get<std::string>(), std::regex(schema["pattern"].get<std::string>(),
                                                            std::regex::ECMAScript))) {
      return false;
    }
    return points >= schema.value("minLength", 0u) && points <= schema.value("maxLength", 1000000u);
  }
  if (schema.contains("multipleOf")) {
    if (!v.is_number()) return false;
    const double q = v.get<double>() / schema["multipleOf"].get<double>();
    if (q != std::floor(q)) return false;
  }
  if (type == "integer") return v.is_number_integer() && bounded(v.get<double>());
  if (type == "number") return v.is_number() && bounded(v.get<double>());
  if (type == "boolean") return v.is_boolean();
  if (type == "null") return v.is_null();
  return true;
}

}  // namespace flotilla::schema_check
