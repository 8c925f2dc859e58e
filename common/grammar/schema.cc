#include "common/grammar/schema.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/grammar/json_matcher.h"
#include "common/grammar/schema_disjoint.h"
#include "common/grammar/text_constraint.h"

namespace flotilla::grammar {
namespace {

using Json = nlohmann::ordered_json;

const std::set<std::string>& KnownKeywords() {
  static const std::set<std::string> known = {
      "type", "properties", "required", "additionalProperties", "items", "minItems", "maxItems",
      "minLength", "maxLength", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
      "enum", "const", "anyOf", "$ref", "$defs", "definitions", "nullable", "pattern", "format",
      "oneOf", "allOf", "prefixItems", "multipleOf", "minProperties", "maxProperties", "propertyNames",
      // Annotations: they constrain nothing (`discriminator` names the
      // property that tells oneOf alternatives apart, which oneOf enforces).
      "title", "description", "default", "examples", "$schema", "$id", "$comment",
      "discriminator", "readOnly", "writeOnly", "deprecated"};
  return known;
}

class Compiler {
 public:
  explicit Compiler(const Json& root) : root_(root) {}

  absl::StatusOr<CompiledSchema> Run() {
    out_.nodes.emplace_back();
    absl::Status st = CompileInto(0, root_, "#");
    if (!st.ok()) return st;
    if (absl::Status u = CheckReadings(); !u.ok()) return u;
    return std::move(out_);
  }

 private:
  static absl::Status Bad(const std::string& where, const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat("json schema at ", where, ": ", what));
  }

  int NewNode() {
    out_.nodes.emplace_back();
    return static_cast<int>(out_.nodes.size()) - 1;
  }

  absl::StatusOr<int> Compile(const Json& schema, const std::string& where) {
    const int id = NewNode();
    absl::Status st = CompileInto(id, schema, where);
    if (!st.ok()) return st;
    return id;
  }

  absl::Status CheckKeywords(const Json& schema, const std::string& where) {
    for (const auto& [key, value] : schema.items()) {
      if (!KnownKeywords().count(key)) {
        return Bad(where, absl::StrCat("unsupported keyword '", key,
                                       "' (structured outputs cannot enforce it)"));
      }
    }
    if (schema.contains("$defs") || schema.contains("definitions")) {
      if (where != "#") return Bad(where, "$defs are supported at the root only");
    }
    return absl::OkStatus();
  }

  absl::Status CompileInto(int id, const Json& schema, const std::string& where) {
    if (++depth_ > 64) return Bad(where, "schema nested too deeply");
    absl::Status st = CompileBody(id, schema, where);
    --depth_;
    return st;
  }

  absl::Status CompileBody(int id, const Json& schema, const std::string& where) {
    if (schema.is_boolean()) {
      if (schema.get<bool>()) return absl::OkStatus();  // true: any value
      return Bad(where, "the schema 'false' admits no value");
    }
    if (!schema.is_object()) return Bad(where, "a schema must be an object");
    if (absl::Status st = CheckKeywords(schema, where); !st.ok()) return st;
    if (absl::Status st = CheckAllOf(schema, where); !st.ok()) return st;
    if (schema.contains("$ref")) return CompileRef(id, schema, where);
    if (schema.value("nullable", false)) {
      Json inner = schema;
      inner.erase("nullable");
      return CompileUnion(id, {inner, Json{{"type", "null"}}}, where);
    }
    if (schema.contains("anyOf") && schema.contains("oneOf")) {
      return Bad(where, "anyOf beside oneOf is not supported");
    }
    if (schema.contains("anyOf")) return CompileAnyOf(id, schema, "anyOf", where);
    if (schema.contains("oneOf")) return CompileAnyOf(id, schema, "oneOf", where);
    if (schema.contains("const")) {
      return CompileLiterals(id, Json::array({schema["const"]}), schema, where + "/const");
    }
    if (schema.contains("enum")) return CompileLiterals(id, schema["enum"], schema, where + "/enum");
    if (!schema.contains("type")) return CompileUntyped(id, schema, where);
    const Json& type = schema["type"];
    if (type.is_array()) {
      std::vector<Json> members;
      for (const Json& t : type) {
        Json member = schema;
        member["type"] = t;
        members.push_back(member);
      }
      if (members.empty()) return Bad(where, "'type' is an empty list");
      if (members.size() == 1) return CompileBody(id, members[0], where);
      return CompileUnion(id, members, where);
    }
    if (!type.is_string()) return Bad(where + "/type", "must be a string or a list of strings");
    return CompileTyped(id, type.get<std::string>(), schema, where);
  }

  // Without `type`, a keyword of one type applies to values of that type
  // only; the value generated is of that type (any value when there is none),
  // so that the keyword is never left unenforced.
  absl::Status CompileUntyped(int id, const Json& schema, const std::string& where) {
    static const std::vector<std::pair<std::string, std::vector<std::string>>> kByType = {
        {"string", {"pattern", "format", "minLength", "maxLength", "allOf"}},
        {"number", {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"}},
        {"object", {"properties", "additionalProperties", "propertyNames", "minProperties",
                    "maxProperties", "required"}},
        {"array", {"items", "prefixItems", "minItems", "maxItems"}},
    };
    std::vector<std::string> types;
    for (const auto& [type, keywords] : kByType) {
      for (const std::string& k : keywords) {
        if (schema.contains(k)) {
          types.push_back(type);
          break;
        }
      }
    }
    if (types.empty()) {
      out_.nodes[id].kind = NodeKind::kAny;
      return absl::OkStatus();
    }
    if (types.size() > 1) {
      return Bad(where, absl::StrCat("keywords of several types (", absl::StrJoin(types, ", "),
                                     ") without 'type' are not supported"));
    }
    return CompileTyped(id, types[0], schema, where);
  }

  // allOf is enforced where it only adds patterns to a string (zod writes
  // startsWith + endsWith so): each must match.
  absl::Status CheckAllOf(const Json& schema, const std::string& where) {
    if (!schema.contains("allOf")) return absl::OkStatus();
    const Json& all = schema["allOf"];
    bool patterns = schema.value("type", Json()) == Json("string") && all.is_array() &&
                    !all.empty() && all.size() <= 8;
    for (size_t i = 0; patterns && i < all.size(); ++i) {
      const Json& member = all[i];
      patterns = member.is_object() && member.contains("pattern") && member["pattern"].is_string();
      for (auto it = member.begin(); patterns && it != member.end(); ++it) {
        patterns = it.key() == "pattern" || it.key() == "title" || it.key() == "description";
      }
    }
    if (patterns) return absl::OkStatus();
    return Bad(where + "/allOf",
               "unsupported keyword 'allOf' (only an allOf of patterns on a string is enforced)");
  }

  absl::Status CompileTyped(int id, const std::string& type, const Json& schema,
                            const std::string& where) {
    if (type != "string" && type != "null" && type != "boolean") {
      for (const char* key : {"pattern", "format"}) {
        if (schema.contains(key)) {
          return Bad(where + "/" + key, absl::StrCat("'", key, "' on a ", type,
                                                     " is not enforced (only on strings)"));
        }
      }
    }
    SchemaNode& n = out_.nodes[id];
    if (type == "object") return CompileObject(id, schema, where);
    if (type == "array") return CompileArray(id, schema, where);
    if (type == "string") return CompileString(id, schema, where);
    if (type == "integer" || type == "number") {
      n.kind = type == "integer" ? NodeKind::kInteger : NodeKind::kNumber;
      if (absl::Status st = ReadBounds(id, schema, where); !st.ok()) return st;
      return ReadMultipleOf(id, schema, where);
    }
    if (type == "boolean") {
      n.kind = NodeKind::kBoolean;
      return absl::OkStatus();
    }
    if (type == "null") {
      n.kind = NodeKind::kNull;
      return absl::OkStatus();
    }
    return Bad(where + "/type", absl::StrCat("unknown type '", type, "'"));
  }

  absl::Status CompileString(int id, const Json& schema, const std::string& where) {
    SchemaNode& n = out_.nodes[id];
    n.kind = NodeKind::kString;
    if (absl::Status st =
            ReadRange(schema, "minLength", "maxLength", &n.min_length, &n.max_length, where);
        !st.ok()) {
      return st;
    }
    TextRequest request;
    if (schema.contains("format")) {
      if (!schema["format"].is_string()) return Bad(where + "/format", "must be a string");
      request.format = schema["format"].get<std::string>();
    }
    if (schema.contains("pattern")) {
      if (!schema["pattern"].is_string()) return Bad(where + "/pattern", "must be a string");
      request.patterns.push_back(schema["pattern"].get<std::string>());
    }
    for (const Json& member : schema.value("allOf", Json::array())) {  // CheckAllOf: patterns
      request.patterns.push_back(member["pattern"].get<std::string>());
    }
    if (request.patterns.empty() && !request.format) return absl::OkStatus();
    request.min_length = n.min_length;
    request.max_length = n.max_length;
    absl::StatusOr<std::shared_ptr<const TextConstraint>> text = CompileTextConstraint(request);
    if (!text.ok()) return Bad(where, std::string(text.status().message()));
    SchemaNode& m = out_.nodes[id];
    m.min_length = (*text)->min_length;
    m.max_length = (*text)->max_length;
    m.text = *std::move(text);
    return absl::OkStatus();
  }

  // Whole multiples only: a number with a whole multipleOf is generated as
  // an integer (a multiple written 10.0 is never needed).
  absl::Status ReadMultipleOf(int id, const Json& schema, const std::string& where) {
    if (!schema.contains("multipleOf")) return absl::OkStatus();
    const Json& v = schema["multipleOf"];
    const std::string at = where + "/multipleOf";
    if (!v.is_number() || v.get<double>() <= 0) return Bad(at, "must be a positive number");
    const double m = v.get<double>();
    if (m != std::floor(m) || m > 1e15) {
      return Bad(at, "only whole multipleOf values (1 to 1e15) are enforced");
    }
    SchemaNode& n = out_.nodes[id];
    n.kind = NodeKind::kInteger;
    n.multiple_of = static_cast<int64_t>(m);
    return absl::OkStatus();
  }

  absl::Status ReadRange(const Json& schema, const char* lo_key, const char* hi_key, int64_t* lo,
                         int64_t* hi, const std::string& where) {
    for (const char* key : {lo_key, hi_key}) {
      if (!schema.contains(key)) continue;
      const Json& v = schema[key];
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > 1000000) {
        return Bad(where + "/" + key, "must be an integer in [0, 1000000]");
      }
      *(key == lo_key ? lo : hi) = v.get<int64_t>();
    }
    if (*hi >= 0 && *lo > *hi) return Bad(where, absl::StrCat(lo_key, " is above ", hi_key));
    return absl::OkStatus();
  }

  absl::Status ReadBounds(int id, const Json& schema, const std::string& where) {
    SchemaNode& n = out_.nodes[id];
    auto number = [&](const char* key, std::optional<double>* into, bool* exclusive) {
      if (!schema.contains(key)) return absl::OkStatus();
      const Json& v = schema[key];
      if (!v.is_number()) return Bad(where + "/" + key, "must be a number");
      *into = v.get<double>();
      if (exclusive != nullptr) *exclusive = true;
      return absl::OkStatus();
    };
    if (auto st = number("minimum", &n.minimum, nullptr); !st.ok()) return st;
    if (auto st = number("maximum", &n.maximum, nullptr); !st.ok()) return st;
    std::optional<double> xmin, xmax;
    bool unused = false;
    if (auto st = number("exclusiveMinimum", &xmin, &unused); !st.ok()) return st;
    if (auto st = number("exclusiveMaximum", &xmax, &unused); !st.ok()) return st;
    if (xmin && (!n.minimum || *xmin >= *n.minimum)) n.minimum = xmin, n.exclusive_minimum = true;
    if (xmax && (!n.maximum || *xmax <= *n.maximum)) n.maximum = xmax, n.exclusive_maximum = true;
    if (n.minimum && n.maximum && *n.minimum > *n.maximum) {
      return Bad(where, "the minimum is above the maximum");
    }
    return absl::OkStatus();
  }

  absl::Status CompileObject(int id, const Json& schema, const std::string& where) {
    out_.nodes[id].kind = NodeKind::kObject;
    std::set<std::string> required;
    if (schema.contains("required")) {
      const Json& r = schema["required"];
      if (!r.is_array()) return Bad(where + "/required", "must be a list of property names");
      for (const Json& name : r) {
        if (!name.is_string()) return Bad(where + "/required", "must be a list of property names");
        required.insert(name.get<std::string>());
      }
    }
    const Json props = schema.value("properties", Json::object());
    if (!props.is_object()) return Bad(where + "/properties", "must be an object");
    if (props.size() > 64) return Bad(where + "/properties", "more than 64 properties");
    for (const auto& [name, sub] : props.items()) {
      absl::StatusOr<int> child = Compile(sub, where + "/properties/" + name);
      if (!child.ok()) return child.status();
      Property p;
      p.key_text = Json(name).dump() + ":";
      p.node = *child;
      out_.nodes[id].properties.push_back(std::move(p));
    }
    if (absl::Status st = CompileAdditional(id, schema, props.empty(), where); !st.ok()) return st;
    // Required names are declared properties (or a record's listed names).
    for (const std::string& name : required) {
      bool found = false;
      for (Property& p : out_.nodes[id].properties) {
        if (p.key_text == Json(name).dump() + ":") p.required = found = true;
      }
      if (!found) {
        return Bad(where + "/required", absl::StrCat("'", name, "' is not a declared property"));
      }
    }
    return CheckPropertyCounts(id, schema, where);
  }

  // additionalProperties: false, true or absent generate the declared
  // properties only (true and absent allow more, which need not be written).
  // A schema with no declared properties is a record: keys of propertyNames
  // (any string without it), values of the schema. An enum of key names
  // becomes declared optional properties.
  absl::Status CompileAdditional(int id, const Json& schema, bool no_declared,
                                 const std::string& where) {
    const bool has_names = schema.contains("propertyNames");
    const Json ap = schema.value("additionalProperties", Json(true));
    const bool record = no_declared && ap.is_object();
    if (!ap.is_boolean() && !ap.is_object()) {
      return Bad(where + "/additionalProperties", "must be a boolean or a schema");
    }
    if (has_names && !record) {
      return Bad(where + "/propertyNames",
                 "is supported on records only (additionalProperties a schema, no properties)");
    }
    if (!record) return absl::OkStatus();
    absl::StatusOr<int> value = Compile(ap, where + "/additionalProperties");
    if (!value.ok()) return value.status();
    // Keys are strings: a propertyNames schema without a type means one.
    Json names = schema.value("propertyNames", Json::object());
    if (names.is_object() && !names.contains("type") && !names.contains("enum") &&
        !names.contains("const") && !names.contains("$ref")) {
      names["type"] = "string";
    }
    absl::StatusOr<int> key = Compile(names, where + "/propertyNames");
    if (!key.ok()) return key.status();
    const SchemaNode& k = out_.nodes[*key];
    if (k.kind == NodeKind::kLiteral) {  // listed names: optional declared properties
      for (const std::string& name : k.literals) {
        if (name.empty() || name[0] != '"') {
          return Bad(where + "/propertyNames", "must list strings");
        }
        Property p;
        p.key_text = name + ":";
        p.node = *value;
        out_.nodes[id].properties.push_back(std::move(p));
      }
      return absl::OkStatus();
    }
    if (k.kind != NodeKind::kString) {
      return Bad(where + "/propertyNames", "must be a string schema (type string)");
    }
    out_.nodes[id].key_node = *key;
    out_.nodes[id].value_node = *value;
    return absl::OkStatus();
  }

  absl::Status CheckPropertyCounts(int id, const Json& schema, const std::string& where) {
    SchemaNode& n = out_.nodes[id];
    if (absl::Status st = ReadRange(schema, "minProperties", "maxProperties", &n.min_properties,
                                    &n.max_properties, where);
        !st.ok()) {
      return st;
    }
    int64_t required = 0;
    for (const Property& p : n.properties) required += p.required ? 1 : 0;
    if (n.max_properties >= 0 && required > n.max_properties) {
      return Bad(where + "/maxProperties", "is below the number of required properties");
    }
    // Record keys are not checked for repeats (a parser keeps the last), so
    // only one of them counts for sure.
    const int64_t most = n.key_node >= 0 ? 1 : static_cast<int64_t>(n.properties.size());
    if (n.min_properties > most) {
      return Bad(where + "/minProperties",
                 n.key_node >= 0
                     ? "above 1 on a record is not enforced (its keys are not checked for repeats)"
                     : "is above the number of properties that can be generated");
    }
    return absl::OkStatus();
  }

  absl::Status CompileArray(int id, const Json& schema, const std::string& where) {
    out_.nodes[id].kind = NodeKind::kArray;
    int64_t lo = 0, hi = -1;
    if (auto st = ReadRange(schema, "minItems", "maxItems", &lo, &hi, where); !st.ok()) return st;
    std::vector<int> prefix;
    if (schema.contains("prefixItems")) {
      const Json& p = schema["prefixItems"];
      if (!p.is_array() || p.size() > 64) {
        return Bad(where + "/prefixItems", "must be a list of at most 64 schemas");
      }
      for (size_t i = 0; i < p.size(); ++i) {
        absl::StatusOr<int> child = Compile(p[i], absl::StrCat(where, "/prefixItems/", i));
        if (!child.ok()) return child.status();
        prefix.push_back(*child);
      }
    }
    int items = -1;
    const bool has_items = schema.contains("items");
    if (has_items && schema["items"] == Json(false)) {
      // No items past the prefix.
      const int64_t cap = static_cast<int64_t>(prefix.size());
      if (lo > cap) return Bad(where + "/minItems", "is above the prefixItems allowed");
      hi = hi < 0 ? cap : std::min(hi, cap);
      items = NewNode();
    } else if (has_items) {
      absl::StatusOr<int> child = Compile(schema["items"], where + "/items");
      if (!child.ok()) return child.status();
      items = *child;
    } else {
      items = NewNode();  // any value
      if (!prefix.empty()) {  // a tuple: no items past it unless minItems asks for them
        const int64_t cap = std::max<int64_t>(static_cast<int64_t>(prefix.size()), lo);
        hi = hi < 0 ? cap : std::min(hi, cap);
      }
    }
    SchemaNode& n = out_.nodes[id];
    n.items = items;
    n.prefix_items = std::move(prefix);
    n.min_items = lo;
    n.max_items = hi;
    return absl::OkStatus();
  }

  // enum / const: the values that also have the schema's `type` (if any)
  // and meet the keywords beside it (a value is kept when the schema without
  // enum / const accepts its text).
  absl::Status CompileLiterals(int id, const Json& values, const Json& schema,
                               const std::string& where) {
    if (!values.is_array() || values.empty()) return Bad(where, "must be a non-empty list");
    if (values.size() > 64) return Bad(where, "more than 64 values");
    std::optional<CompiledSchema> beside;
    if (ConstrainsBeside(schema)) {
      Json rest = schema;
      rest.erase("enum");
      rest.erase("const");
      absl::StatusOr<CompiledSchema> compiled = CompileSchema(rest);
      if (!compiled.ok()) return compiled.status();
      beside = *std::move(compiled);
    }
    std::vector<std::string> literals;
    for (const Json& v : values) {
      if (schema.contains("type") && !HasType(v, schema["type"])) continue;
      const std::string text = v.dump();
      if (beside && !MatchesWhole(*beside, text)) continue;
      literals.push_back(text);
    }
    if (literals.empty()) return Bad(where, "no value meets the schema's other keywords");
    out_.nodes[id].kind = NodeKind::kLiteral;
    out_.nodes[id].literals = std::move(literals);
    return absl::OkStatus();
  }

  // Whether a schema with enum / const says more than type and annotations.
  static bool ConstrainsBeside(const Json& schema) {
    static const std::set<std::string> kPlain = {
        "enum", "const", "type", "title", "description", "default", "examples", "$schema", "$id",
        "$comment", "readOnly", "writeOnly", "deprecated", "nullable"};
    for (const auto& [key, value] : schema.items()) {
      if (!kPlain.count(key)) return true;
    }
    return false;
  }

  static bool HasType(const Json& v, const Json& type) {
    if (type.is_array()) {
      for (const Json& t : type) {
        if (HasType(v, t)) return true;
      }
      return false;
    }
    if (!type.is_string()) return false;
    const std::string t = type.get<std::string>();
    if (t == "integer") return v.is_number_integer() || (v.is_number() && v.get<double>() == std::floor(v.get<double>()));
    return (t == "number" && v.is_number()) || (t == "string" && v.is_string()) ||
           (t == "boolean" && v.is_boolean()) || (t == "null" && v.is_null()) ||
           (t == "object" && v.is_object()) || (t == "array" && v.is_array());
  }

  // anyOf, and oneOf where its alternatives exclude each other (then a value
  // generated for one matches no other, and oneOf holds as anyOf does).
  absl::Status CompileAnyOf(int id, const Json& schema, const std::string& keyword,
                            const std::string& where) {
    const Json& any = schema[keyword];
    const std::string at = where + "/" + keyword;
    if (!any.is_array() || any.empty() || any.size() > 64) {
      return Bad(at, "must be a non-empty list of at most 64 schemas");
    }
    static const std::set<std::string> kBeside = {
        "title", "description", "$defs", "definitions", "default", "examples", "$schema",
        "$id", "$comment", "discriminator", "readOnly", "writeOnly", "deprecated"};
    for (const auto& [key, value] : schema.items()) {
      if (key != keyword && !kBeside.count(key)) {
        return Bad(where, absl::StrCat("'", key, "' beside ", keyword, " is not supported"));
      }
    }
    if (keyword == "oneOf") {
      for (size_t i = 0; i < any.size(); ++i) {
        for (size_t j = i + 1; j < any.size(); ++j) {
          if (ProvablyDisjoint(any[i], any[j], root_)) continue;
          return Bad(at, absl::StrCat(
                             "alternatives ", i, " and ", j,
                             " may both match one value (oneOf is enforced only where its "
                             "alternatives exclude each other: different types, different "
                             "const/enum values, or a required property that tells them apart)"));
        }
      }
    }
    return CompileUnion(id, std::vector<Json>(any.begin(), any.end()), at);
  }

  absl::Status CompileUnion(int id, const std::vector<Json>& members, const std::string& where) {
    std::vector<int> alternatives;
    for (size_t i = 0; i < members.size(); ++i) {
      absl::StatusOr<int> child = Compile(members[i], absl::StrCat(where, "/", i));
      if (!child.ok()) return child.status();
      alternatives.push_back(*child);
    }
    out_.nodes[id].kind = NodeKind::kUnion;
    out_.nodes[id].alternatives = std::move(alternatives);
    union_where_[id] = where;
    return absl::OkStatus();
  }

  absl::Status CompileRef(int id, const Json& schema, const std::string& where) {
    const Json& ref = schema["$ref"];
    if (!ref.is_string()) return Bad(where + "/$ref", "must be a string");
    const std::string r = ref.get<std::string>();
    static const std::set<std::string> kBeside = {"$ref", "description", "title", "$defs",
                                                  "definitions", "$schema", "$id", "$comment"};
    for (const auto& [key, value] : schema.items()) {
      if (!kBeside.count(key)) {
        return Bad(where, absl::StrCat("'", key, "' beside $ref is not supported"));
      }
    }
    auto found = refs_.find(r);
    int target;
    if (found != refs_.end()) {
      target = found->second;
    } else if (r == "#") {
      target = 0;
    } else {
      const Json* def = Resolve(r);
      if (def == nullptr) {
        return Bad(where + "/$ref",
                   absl::StrCat("'", r, "' is not a local #/$defs/NAME or #/definitions/NAME"));
      }
      target = NewNode();
      refs_[r] = target;
      if (absl::Status st = CompileInto(target, *def, r); !st.ok()) return st;
    }
    // A reference is a one-member union: it shares the target (recursion ok).
    out_.nodes[id].kind = NodeKind::kUnion;
    out_.nodes[id].alternatives = {target};
    union_where_[id] = where;
    return absl::OkStatus();
  }

  const Json* Resolve(const std::string& ref) const {
    for (const char* prefix : {"#/$defs/", "#/definitions/"}) {
      const std::string p = prefix;
      if (ref.rfind(p, 0) != 0) continue;
      const std::string name = ref.substr(p.size());
      const std::string table = p.substr(2, p.size() - 3);
      if (root_.is_object() && root_.contains(table) && root_[table].is_object() &&
          root_[table].contains(name)) {
        return &root_[table][name];
      }
    }
    return nullptr;
  }

  // The bytes a value of `node` may start with, as a 256-bit set.
  void FirstBytes(int node, std::set<int>* visiting, std::vector<bool>* bytes) const {
    if (visiting->count(node)) return;
    visiting->insert(node);
    const SchemaNode& n = out_.nodes[node];
    auto add = [&](const std::string& chars) {
      for (char c : chars) (*bytes)[static_cast<unsigned char>(c)] = true;
    };
    switch (n.kind) {
      case NodeKind::kAny: add("{[\"-0123456789tfn"); break;
      case NodeKind::kObject: add("{"); break;
      case NodeKind::kArray: add("["); break;
      case NodeKind::kString: add("\""); break;
      case NodeKind::kInteger:
      case NodeKind::kNumber: add("-0123456789"); break;
      case NodeKind::kBoolean: add("tf"); break;
      case NodeKind::kNull: add("n"); break;
      case NodeKind::kLiteral:
        for (const std::string& l : n.literals) add(l.substr(0, 1));
        break;
      case NodeKind::kUnion:
        for (int a : n.alternatives) FirstBytes(a, visiting, bytes);
        break;
    }
  }

  // The most readings the matcher may follow at once inside a value of
  // `node`, given those of the other nodes (`readings`): one for a scalar,
  // an object's or array's widest member (members are read one at a time),
  // and for a union the most that values starting with one byte can need.
  int Readings(int node, const std::vector<int>& readings) const {
    const SchemaNode& n = out_.nodes[node];
    int most = 1;
    switch (n.kind) {
      case NodeKind::kObject:
        for (const Property& p : n.properties) most = std::max(most, readings[p.node]);
        for (int member : {n.key_node, n.value_node}) {
          if (member >= 0) most = std::max(most, readings[member]);
        }
        return most;
      case NodeKind::kArray:
        most = readings[n.items];
        for (int item : n.prefix_items) most = std::max(most, readings[item]);
        return most;
      case NodeKind::kUnion: {
        std::vector<int> per_byte(256, 0);
        for (int a : n.alternatives) {
          std::vector<bool> first(256, false);
          std::set<int> visiting = {node};
          FirstBytes(a, &visiting, &first);
          for (int b = 0; b < 256; ++b) {
            if (first[b]) per_byte[b] += readings[a];
          }
        }
        for (int count : per_byte) most = std::max(most, count);
        return most;
      }
      default: return 1;
    }
  }

  // Alternatives that share a first byte are followed side by side, at most
  // kMaxJointReadings at once; a schema that could need more is refused.
  // The counts grow to a fixed point (capped), so recursion is covered.
  absl::Status CheckReadings() const {
    std::vector<int> readings(out_.nodes.size(), 1);
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t i = 0; i < out_.nodes.size(); ++i) {
        const int r = std::min(Readings(static_cast<int>(i), readings), kMaxJointReadings + 1);
        if (r > readings[i]) readings[i] = r, changed = true;
      }
    }
    for (size_t i = 0; i < out_.nodes.size(); ++i) {
      if (out_.nodes[i].kind != NodeKind::kUnion || readings[i] <= kMaxJointReadings) continue;
      auto w = union_where_.find(static_cast<int>(i));
      return Bad(w == union_where_.end() ? "#" : w->second,
                 absl::StrCat("anyOf / type-list alternatives that begin alike would need more "
                              "than ", kMaxJointReadings,
                              " readings at once (too many alternatives sharing a first byte, "
                              "or such unions nested in each other or in themselves)"));
    }
    return absl::OkStatus();
  }

  const Json& root_;
  CompiledSchema out_;
  std::map<std::string, int> refs_;
  std::map<int, std::string> union_where_;
  int depth_ = 0;
};

}  // namespace

absl::StatusOr<CompiledSchema> CompileSchema(const nlohmann::ordered_json& schema) {
  return Compiler(schema).Run();
}

CompiledSchema AnyObjectSchema() {
  CompiledSchema s;
  s.nodes.resize(1);
  s.nodes[0].kind = NodeKind::kAny;
  s.nodes[0].object_only = true;
  return s;
}

}  // namespace flotilla::grammar
