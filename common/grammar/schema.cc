#include "common/grammar/schema.h"

#include <algorithm>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace flotilla::grammar {
namespace {

using Json = nlohmann::json;

const std::set<std::string>& KnownKeywords() {
  static const std::set<std::string> known = {
      "type", "properties", "required", "additionalProperties", "items", "minItems", "maxItems",
      "minLength", "maxLength", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
      "enum", "const", "anyOf", "$ref", "$defs", "definitions", "nullable",
      // Annotations: they constrain nothing.
      "title", "description", "default", "examples", "$schema", "$id", "$comment"};
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
    if (schema.contains("$ref")) return CompileRef(id, schema, where);
    if (schema.value("nullable", false)) {
      Json inner = schema;
      inner.erase("nullable");
      return CompileUnion(id, {inner, Json{{"type", "null"}}}, where);
    }
    if (schema.contains("anyOf")) return CompileAnyOf(id, schema, where);
    if (schema.contains("const")) return CompileLiterals(id, Json::array({schema["const"]}), where);
    if (schema.contains("enum")) return CompileLiterals(id, schema["enum"], where + "/enum");
    if (!schema.contains("type")) {
      if (schema.contains("properties")) return CompileObject(id, schema, where);
      if (schema.contains("items")) return CompileArray(id, schema, where);
      out_.nodes[id].kind = NodeKind::kAny;
      return absl::OkStatus();
    }
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

  absl::Status CompileTyped(int id, const std::string& type, const Json& schema,
                            const std::string& where) {
    SchemaNode& n = out_.nodes[id];
    if (type == "object") return CompileObject(id, schema, where);
    if (type == "array") return CompileArray(id, schema, where);
    if (type == "string") {
      n.kind = NodeKind::kString;
      return ReadRange(schema, "minLength", "maxLength", &n.min_length, &n.max_length, where);
    }
    if (type == "integer" || type == "number") {
      n.kind = type == "integer" ? NodeKind::kInteger : NodeKind::kNumber;
      return ReadBounds(id, schema, where);
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
    if (schema.contains("additionalProperties")) {
      const Json& ap = schema["additionalProperties"];
      if (!(ap.is_boolean() && !ap.get<bool>())) {
        return Bad(where + "/additionalProperties",
                   "only 'false' is supported (no undeclared properties are generated)");
      }
    }
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
    for (const std::string& name : required) {
      if (!props.contains(name)) {
        return Bad(where + "/required", absl::StrCat("'", name, "' is not a declared property"));
      }
    }
    for (const auto& [name, sub] : props.items()) {
      absl::StatusOr<int> child = Compile(sub, where + "/properties/" + name);
      if (!child.ok()) return child.status();
      Property p;
      p.key_text = Json(name).dump() + ":";
      p.node = *child;
      p.required = required.count(name) > 0;
      out_.nodes[id].properties.push_back(std::move(p));
    }
    return absl::OkStatus();
  }

  absl::Status CompileArray(int id, const Json& schema, const std::string& where) {
    out_.nodes[id].kind = NodeKind::kArray;
    int64_t lo = 0, hi = -1;
    if (auto st = ReadRange(schema, "minItems", "maxItems", &lo, &hi, where); !st.ok()) return st;
    int items = -1;
    if (schema.contains("items")) {
      absl::StatusOr<int> child = Compile(schema["items"], where + "/items");
      if (!child.ok()) return child.status();
      items = *child;
    } else {
      items = NewNode();  // any value
    }
    SchemaNode& n = out_.nodes[id];
    n.items = items;
    n.min_items = lo;
    n.max_items = hi;
    return absl::OkStatus();
  }

  absl::Status CompileLiterals(int id, const Json& values, const std::string& where) {
    if (!values.is_array() || values.empty()) return Bad(where, "must be a non-empty list");
    if (values.size() > 64) return Bad(where, "more than 64 values");
    SchemaNode& n = out_.nodes[id];
    n.kind = NodeKind::kLiteral;
    for (const Json& v : values) n.literals.push_back(v.dump());
    return absl::OkStatus();
  }

  absl::Status CompileAnyOf(int id, const Json& schema, const std::string& where) {
    const Json& any = schema["anyOf"];
    if (!any.is_array() || any.empty()) return Bad(where + "/anyOf", "must be a non-empty list");
    for (const auto& [key, value] : schema.items()) {
      if (key != "anyOf" && key != "title" && key != "description" && key != "$defs" &&
          key != "definitions" && key != "default" && key != "examples" && key != "$schema") {
        return Bad(where, absl::StrCat("'", key, "' beside anyOf is not supported"));
      }
    }
    return CompileUnion(id, std::vector<Json>(any.begin(), any.end()), where + "/anyOf");
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
    if (schema.size() > 1 && !(schema.size() == 2 && schema.contains("description"))) {
      return Bad(where, "keywords beside $ref are not supported");
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
        return most;
      case NodeKind::kArray: return readings[n.items];
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

absl::StatusOr<CompiledSchema> CompileSchema(const nlohmann::json& schema) {
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
