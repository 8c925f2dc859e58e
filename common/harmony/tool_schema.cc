#include "common/harmony/tool_schema.h"

#include <algorithm>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/harmony/errors.h"
#include "common/status.h"

namespace flotilla::harmony {
namespace {

using Json = nlohmann::ordered_json;

constexpr int kMaxNesting = 32;

// ---------------------------------------------------------------------------
// Preparation: validation, local $ref inlining, anyOf read as oneOf.

struct PrepareContext {
  const Json& root;
  std::vector<std::string> refs_in_progress;  // to stop at recursive references
};

absl::StatusOr<Json> Prepare(const Json& schema, const std::string& where, int nesting, PrepareContext& context);

// The schema a local reference ("#/$defs/Name", a JSON pointer into the
// parameters schema) points to, or nullptr.
const Json* ResolveLocalRef(const Json& root, const std::string& ref) {
  if (ref == "#") return &root;
  if (ref.rfind("#/", 0) != 0) return nullptr;
  const Json* node = &root;
  for (absl::string_view raw : absl::StrSplit(absl::string_view(ref).substr(2), '/')) {
    std::string token(raw);
    for (size_t pos = 0; (pos = token.find('~', pos)) != std::string::npos; ++pos) {
      if (pos + 1 < token.size() && token[pos + 1] == '1') token.replace(pos, 2, "/");
      else if (pos + 1 < token.size() && token[pos + 1] == '0') token.replace(pos, 2, "~");
    }
    if (!node->is_object()) return nullptr;
    auto it = node->find(token);
    if (it == node->end()) return nullptr;
    node = &*it;
  }
  return node;
}

// A `$ref` replaced by its target, the referring schema's other keys laid over
// it. A reference to a schema that is being expanded (a recursive type)
// becomes `{}`, which renders as `any`.
absl::StatusOr<Json> InlineRef(const Json& schema, const std::string& where, int nesting, PrepareContext& context) {
  const Json& ref = schema["$ref"];
  if (!ref.is_string()) return MalformedToolSchema(where + ".$ref", "must be a string");
  const std::string target_name = ref.get<std::string>();
  const Json* target = ResolveLocalRef(context.root, target_name);
  if (target == nullptr) {
    return MalformedToolSchema(
        where + ".$ref", absl::StrCat("'", target_name,
                                      "' does not resolve (only local references such as "
                                      "#/$defs/Name into the parameters schema are supported)"));
  }
  auto& stack = context.refs_in_progress;
  if (std::find(stack.begin(), stack.end(), target_name) != stack.end()) return Json::object();
  Json merged = target->is_object() ? *target : Json::object();
  for (auto it = schema.begin(); it != schema.end(); ++it) {
    if (it.key() != "$ref") merged[it.key()] = it.value();
  }
  stack.push_back(target_name);
  absl::StatusOr<Json> out = Prepare(merged, where, nesting + 1, context);
  stack.pop_back();
  return out;
}

absl::Status CheckType(const Json& type, const std::string& where) {
  static const std::set<std::string> kNames = {"string", "number", "integer", "boolean", "array", "object", "null"};
  auto check_one = [&](const Json& name) -> absl::Status {
    if (!name.is_string())
      return MalformedToolSchema(where, "must be a string or an array of strings");
    if (!kNames.count(name.get<std::string>())) {
      return MalformedToolSchema(
          where,
          absl::StrCat("unknown type '", name.get<std::string>(),
                       "' (expected string, number, integer, boolean, array, object or null)"));
    }
    return absl::OkStatus();
  };
  if (type.is_array()) {
    if (type.empty())
      return MalformedToolSchema(where, "must be a string or a non-empty array of strings");
    for (const auto& one : type) FLOTILLA_RETURN_IF_ERROR(check_one(one));
    return absl::OkStatus();
  }
  return check_one(type);
}

absl::Status PrepareProperties(Json& schema, const std::string& where, int nesting, PrepareContext& context) {
  auto props = schema.find("properties");
  if (props != schema.end()) {
    if (!props->is_object()) return MalformedToolSchema(where + ".properties", "must be an object");
    for (auto it = props->begin(); it != props->end(); ++it) {
      const std::string pw = absl::StrCat(where, ".properties.", it.key());
      FLOTILLA_ASSIGN_OR_RETURN(it.value(), Prepare(it.value(), pw, nesting + 1, context));
    }
  }
  if (auto req = schema.find("required"); req != schema.end()) {
    if (!req->is_array())
      return MalformedToolSchema(where + ".required", "must be an array of property names");
    for (const auto& name : *req) {
      if (!name.is_string())
        return MalformedToolSchema(where + ".required", "must be an array of property names");
      // A record's required keys may be names its propertyNames enum lists.
      const Json names = schema.value("propertyNames", Json::object());
      const bool listed = names.is_object() && names.contains("enum") && names["enum"].is_array() &&
                          std::find(names["enum"].begin(), names["enum"].end(), name) != names["enum"].end();
      if (!listed && (props == schema.end() || !props->contains(name.get<std::string>()))) {
        return MalformedToolSchema(
            where + ".required",
            absl::StrCat("names '", name.get<std::string>(), "', which is not a property"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status PrepareVariants(Json& schema, const char* key, const std::string& where, int nesting,
                             PrepareContext& context) {
  auto variants = schema.find(key);
  if (variants == schema.end()) return absl::OkStatus();
  const std::string vw = absl::StrCat(where, ".", key);
  if (!variants->is_array() || variants->empty())
    return MalformedToolSchema(vw, "must be a non-empty array of schemas");
  for (size_t i = 0; i < variants->size(); ++i) {
    FLOTILLA_ASSIGN_OR_RETURN((*variants)[i],
                              Prepare((*variants)[i], absl::StrCat(vw, "[", i, "]"), nesting + 1, context));
  }
  return absl::OkStatus();
}

absl::StatusOr<Json> Prepare(const Json& schema, const std::string& where, int nesting, PrepareContext& context) {
  if (nesting > kMaxNesting)
    return MalformedToolSchema(where, "is nested more than 32 levels deep");
  if (schema.is_boolean()) return schema;
  if (!schema.is_object()) return MalformedToolSchema(where, "must be a schema object");
  if (schema.contains("$ref")) return InlineRef(schema, where, nesting, context);
  Json out = schema;
  if (auto t = out.find("type"); t != out.end()) FLOTILLA_RETURN_IF_ERROR(CheckType(*t, where + ".type"));
  if (auto d = out.find("description"); d != out.end() && !d->is_string()) {
    return MalformedToolSchema(where + ".description", "must be a string");
  }
  if (auto e = out.find("enum"); e != out.end() && (!e->is_array() || e->empty())) {
    return MalformedToolSchema(where + ".enum", "must be a non-empty array");
  }
  FLOTILLA_RETURN_IF_ERROR(PrepareProperties(out, where, nesting, context));
  if (auto items = out.find("items"); items != out.end() && !items->is_boolean()) {
    if (!items->is_object())
      return MalformedToolSchema(where + ".items", "must be a schema object");
    FLOTILLA_ASSIGN_OR_RETURN(*items, Prepare(*items, where + ".items", nesting + 1, context));
  }
  FLOTILLA_RETURN_IF_ERROR(PrepareVariants(out, "oneOf", where, nesting, context));
  FLOTILLA_RETURN_IF_ERROR(PrepareVariants(out, "anyOf", where, nesting, context));
  if (out.contains("anyOf") && !out.contains("oneOf") && !out.contains("type")) {
    out["oneOf"] = std::move(out["anyOf"]);
    out.erase("anyOf");
  }
  return out;
}

// ---------------------------------------------------------------------------
// Rendering, rule for rule as the reference renderer.

std::string JsonText(const Json& value) { return value.dump(-1, ' ', false, Json::error_handler_t::replace); }

const std::string* StringField(const Json& schema, const char* key) {
  if (!schema.is_object()) return nullptr;
  auto it = schema.find(key);
  return it != schema.end() && it->is_string() ? it->get_ptr<const std::string*>() : nullptr;
}

const Json* Field(const Json& schema, const char* key) {
  if (!schema.is_object()) return nullptr;
  auto it = schema.find(key);
  return it != schema.end() ? &*it : nullptr;
}

bool HasEnum(const Json& schema) {
  const Json* e = Field(schema, "enum");
  return e != nullptr && e->is_array() && !e->empty();
}

bool IsNullable(const Json& schema) {
  const Json* n = Field(schema, "nullable");
  return n != nullptr && n->is_boolean() && n->get<bool>();
}

// " | null" after a nullable schema's type, unless the type already says null.
std::string WithNullable(std::string type, const Json& schema) {
  if (IsNullable(schema) && type.find("null") == std::string::npos) type += " | null";
  return type;
}

// A default inside a property or a property's variant: a string in quotes,
// bare when the schema is an enum; anything else as compact JSON.
std::string PropertyDefault(const Json& schema, const Json& value) {
  if (!value.is_string()) return JsonText(value);
  if (HasEnum(schema)) return value.get<std::string>();
  return absl::StrCat("\"", value.get<std::string>(), "\"");
}

// A default of a variant of a bare oneOf type: strings in quotes unless the
// variant is an enum, which gets the JSON literal.
std::string VariantDefault(const Json& schema, const Json& value) {
  if (value.is_string() && !HasEnum(schema)) return absl::StrCat("\"", value.get<std::string>(), "\"");
  return JsonText(value);
}

std::string TrailingComment(const std::vector<std::string>& comments) {
  return comments.empty() ? "" : absl::StrCat(" // ", absl::StrJoin(comments, " "));
}

// A bare oneOf: each variant on its own line, "\n<indent> | TYPE // comments".
std::string RenderOneOf(const Json& variants, const std::string& indent) {
  std::string out;
  for (const auto& variant : variants) {
    absl::StrAppend(&out, "\n", indent, " | ", WithNullable(SchemaToTypeScript(variant, indent + "   "), variant));
    std::vector<std::string> comments;
    if (const std::string* d = StringField(variant, "description")) comments.push_back(*d);
    if (const Json* def = Field(variant, "default")) {
      comments.push_back(absl::StrCat("default: ", VariantDefault(variant, *def)));
    }
    out += TrailingComment(comments);
  }
  return out;
}

// The comment lines above a property: title, description (unless the
// property is a oneOf, which places its description itself), examples.
std::string PropertyComments(const Json& property, const std::string& indent) {
  std::string out;
  if (const std::string* title = StringField(property, "title")) {
    absl::StrAppend(&out, indent, "// ", *title, "\n", indent, "//\n");
  }
  if (Field(property, "oneOf") == nullptr) {
    if (const std::string* d = StringField(property, "description")) absl::StrAppend(&out, indent, "// ", *d, "\n");
  }
  const Json* examples = Field(property, "examples");
  if (examples != nullptr && examples->is_array() && !examples->empty()) {
    absl::StrAppend(&out, indent, "// Examples:\n");
    for (const auto& example : *examples) {
      if (example.is_string()) absl::StrAppend(&out, indent, "// - \"", example.get<std::string>(), "\"\n");
    }
  }
  return out;
}

// A property whose schema is a oneOf: its description and default above the
// name, then one line per variant with that variant's own comments.
std::string RenderOneOfProperty(const std::string& name, const Json& property, const std::string& indent) {
  const Json& variants = property["oneOf"];
  const std::string* property_description = StringField(property, "description");
  const std::string* first_description = StringField(variants.front(), "description");
  const bool description_above = property_description != nullptr &&
                                 !(first_description != nullptr && *first_description == *property_description);
  std::string out;
  if (description_above) absl::StrAppend(&out, indent, "// ", *property_description, "\n");
  if (const Json* def = Field(property, "default")) {
    absl::StrAppend(&out, indent, "// default: ", PropertyDefault(property, *def), "\n");
  }
  absl::StrAppend(&out, indent, name, ":\n");
  for (size_t i = 0; i < variants.size(); ++i) {
    const Json& variant = variants[i];
    absl::StrAppend(&out, indent, " | ", WithNullable(SchemaToTypeScript(variant, indent + "   "), variant));
    std::vector<std::string> comments;
    const std::string* d = StringField(variant, "description");
    const bool same_as_property = property_description != nullptr && d != nullptr && *d == *property_description;
    if (!(i == 0 && description_above) && d != nullptr && !same_as_property) comments.push_back(*d);
    if (const Json* def = Field(variant, "default")) {
      comments.push_back(absl::StrCat("default: ", PropertyDefault(variant, *def)));
    }
    absl::StrAppend(&out, TrailingComment(comments), "\n");
  }
  absl::StrAppend(&out, indent, ",\n");
  return out;
}

std::string RenderProperty(const std::string& key, const Json& property, bool required, const std::string& indent) {
  const std::string name = required ? key : key + "?";
  std::string out = PropertyComments(property, indent);
  const Json* one_of = Field(property, "oneOf");
  if (one_of != nullptr && one_of->is_array()) return out + RenderOneOfProperty(name, property, indent);
  absl::StrAppend(&out, indent, name, ": ", WithNullable(SchemaToTypeScript(property, indent + "    "), property),
                  ",");
  if (one_of == nullptr) {
    if (const Json* def = Field(property, "default")) {
      absl::StrAppend(&out, " // default: ", PropertyDefault(property, *def));
    }
  }
  return out + "\n";
}

std::string RenderObject(const Json& schema, const std::string& indent) {
  std::string out;
  if (const std::string* d = StringField(schema, "description")) absl::StrAppend(&out, indent, "// ", *d, "\n");
  out += "{\n";
  const Json* props = Field(schema, "properties");
  if (props != nullptr && props->is_object()) {
    std::set<std::string> required;
    if (const Json* req = Field(schema, "required"); req != nullptr && req->is_array()) {
      for (const auto& r : *req) {
        if (r.is_string()) required.insert(r.get<std::string>());
      }
    }
    for (auto it = props->begin(); it != props->end(); ++it) {
      out += RenderProperty(it.key(), it.value(), required.count(it.key()) > 0, indent);
    }
  }
  absl::StrAppend(&out, indent, "}");
  return out;
}

std::string RenderStringType(const Json& schema) {
  std::vector<std::string> values;
  if (const Json* e = Field(schema, "enum"); e != nullptr && e->is_array()) {
    for (const auto& v : *e) {
      if (v.is_string()) values.push_back(absl::StrCat("\"", v.get<std::string>(), "\""));
    }
  }
  return values.empty() ? "string" : absl::StrJoin(values, " | ");
}

std::string RenderNamedType(const std::string& type, const Json& schema, const std::string& indent) {
  if (type == "object") return RenderObject(schema, indent);
  if (type == "string") return RenderStringType(schema);
  if (type == "number" || type == "integer") return "number";
  if (type == "boolean") return "boolean";
  if (type == "array") {
    const Json* items = Field(schema, "items");
    return items != nullptr ? SchemaToTypeScript(*items, indent) + "[]" : "Array<any>";
  }
  return "any";
}

}  // namespace

absl::StatusOr<Json> PrepareToolSchema(const Json& schema, const std::string& where) {
  PrepareContext context{schema, {}};
  return Prepare(schema, where, 0, context);
}

std::string SchemaToTypeScript(const Json& schema, const std::string& indent) {
  if (const Json* one_of = Field(schema, "oneOf"); one_of != nullptr && one_of->is_array()) {
    return RenderOneOf(*one_of, indent);
  }
  const Json* type = Field(schema, "type");
  if (type != nullptr && type->is_array()) {
    std::vector<std::string> names;
    for (const auto& t : *type) {
      if (t.is_string()) names.push_back(t == "integer" ? "number" : t.get<std::string>());
    }
    if (!names.empty()) return absl::StrJoin(names, " | ");
  }
  if (type != nullptr && type->is_string()) return RenderNamedType(type->get<std::string>(), schema, indent);
  return "any";
}

std::vector<std::string> DescriptionLines(const std::string& text) {
  std::vector<std::string> lines;
  if (text.empty()) return lines;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    lines.emplace_back(line);
  }
  if (text.back() == '\n') lines.pop_back();
  return lines;
}

}  // namespace flotilla::harmony
