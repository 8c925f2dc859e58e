#include "common/grammar/schema_disjoint.h"

#include <string>

namespace flotilla::grammar {
namespace {

using Json = nlohmann::ordered_json;

constexpr int kMaxDepth = 16;
// Schemas visited in one check: unions of unions could otherwise branch
// exponentially; past it the alternatives are not shown apart (refused).
constexpr int kMaxSteps = 2000;
enum TypeBit : unsigned { kNull = 1, kBoolean = 2, kObject = 4, kArray = 8, kString = 16,
                          kNumber = 32, kAll = 63 };

unsigned TypeOfName(const std::string& name) {
  if (name == "null") return kNull;
  if (name == "boolean") return kBoolean;
  if (name == "object") return kObject;
  if (name == "array") return kArray;
  if (name == "string") return kString;
  if (name == "integer" || name == "number") return kNumber;
  return kAll;
}

unsigned TypeOfValue(const Json& v) {
  if (v.is_null()) return kNull;
  if (v.is_boolean()) return kBoolean;
  if (v.is_object()) return kObject;
  if (v.is_array()) return kArray;
  if (v.is_string()) return kString;
  return kNumber;
}

// The schema a $ref chain leads to (null: unresolved or too long).
const Json* Deref(const Json* s, const Json& root) {
  for (int hops = 0; s != nullptr && s->is_object() && s->contains("$ref"); ++hops) {
    const Json& ref = (*s)["$ref"];
    if (hops > kMaxDepth || !ref.is_string()) return nullptr;
    const std::string r = ref.get<std::string>();
    if (r == "#") {
      s = &root;
      continue;
    }
    s = nullptr;
    for (const std::string table : {"$defs", "definitions"}) {
      const std::string prefix = "#/" + table + "/";
      if (r.rfind(prefix, 0) != 0 || !root.is_object() || !root.contains(table)) continue;
      const Json& defs = root[table];
      const std::string name = r.substr(prefix.size());
      if (defs.is_object() && defs.contains(name)) s = &defs[name];
    }
  }
  return s;
}

const Json* Literals(const Json& s) {
  if (s.contains("enum") && s["enum"].is_array()) return &s["enum"];
  return nullptr;
}

// The JSON types a schema may accept.
unsigned Types(const Json& s, const Json& root, int depth, int* steps) {
  if (!s.is_object() || depth > kMaxDepth || ++*steps > kMaxSteps) return kAll;
  if (s.contains("const")) return TypeOfValue(s["const"]);
  if (const Json* values = Literals(s)) {
    unsigned t = 0;
    for (const Json& v : *values) t |= TypeOfValue(v);
    return t;
  }
  unsigned t = kAll;
  if (s.contains("type")) {
    const Json& type = s["type"];
    t = 0;
    if (type.is_string()) t = TypeOfName(type.get<std::string>());
    if (type.is_array()) {
      for (const Json& name : type) t |= name.is_string() ? TypeOfName(name.get<std::string>()) : kAll;
    }
    if (s.value("nullable", false)) t |= kNull;
  }
  for (const char* key : {"anyOf", "oneOf"}) {
    if (!s.contains(key) || !s[key].is_array()) continue;
    unsigned members = 0;
    for (const Json& m : s[key]) {
      const Json* d = Deref(&m, root);
      members |= d == nullptr ? kAll : Types(*d, root, depth + 1, steps);
    }
    t &= members;
  }
  return t;
}

bool Disjoint(const Json* a, const Json* b, const Json& root, int depth, int* steps);

// Objects that a required property tells apart: its values cannot agree, or
// one side forbids it.
bool ObjectsDisjoint(const Json& a, const Json& b, const Json& root, int depth, int* steps) {
  auto required = [](const Json& s) {
    return s.contains("required") && s["required"].is_array() ? s["required"] : Json::array();
  };
  auto property = [](const Json& s, const std::string& name) -> const Json* {
    if (!s.contains("properties") || !s["properties"].is_object()) return nullptr;
    const Json& p = s["properties"];
    return p.contains(name) ? &p[name] : nullptr;
  };
  auto closed = [](const Json& s) {
    return s.contains("additionalProperties") && s["additionalProperties"] == Json(false);
  };
  for (const auto& [x, y] : {std::pair{&a, &b}, std::pair{&b, &a}}) {
    for (const Json& name : required(*x)) {
      if (!name.is_string()) continue;
      const std::string n = name.get<std::string>();
      const Json* px = property(*x, n);
      const Json* py = property(*y, n);
      if (py == nullptr && closed(*y)) return true;
      if (px != nullptr && py != nullptr) {
        bool y_requires = false;
        for (const Json& r : required(*y)) y_requires = y_requires || r == name;
        if (y_requires && Disjoint(px, py, root, depth + 1, steps)) return true;
      }
    }
  }
  return false;
}

bool Disjoint(const Json* a, const Json* b, const Json& root, int depth, int* steps) {
  if (depth > kMaxDepth || ++*steps > kMaxSteps) return false;
  a = Deref(a, root);
  b = Deref(b, root);
  if (a == nullptr || b == nullptr || !a->is_object() || !b->is_object()) return false;
  const unsigned common = Types(*a, root, depth, steps) & Types(*b, root, depth, steps);
  if (common == 0) return true;
  for (const auto& [x, y] : {std::pair{a, b}, std::pair{b, a}}) {
    for (const char* key : {"anyOf", "oneOf"}) {  // every member apart from the other side
      if (!x->contains(key) || !(*x)[key].is_array()) continue;
      bool all = true;
      for (const Json& m : (*x)[key]) all = all && Disjoint(&m, y, root, depth + 1, steps);
      if (all) return true;
    }
  }
  auto values = [](const Json& s) -> Json {
    if (s.contains("const")) return Json::array({s["const"]});
    if (s.contains("enum") && s["enum"].is_array()) return s["enum"];
    return nullptr;
  };
  const Json va = values(*a), vb = values(*b);
  if (!va.is_null() && !vb.is_null()) {
    for (const Json& x : va) {
      for (const Json& y : vb) {
        if (x == y) return false;
      }
    }
    return true;
  }
  if (common == kObject) return ObjectsDisjoint(*a, *b, root, depth, steps);
  return false;
}

}  // namespace

bool ProvablyDisjoint(const Json& a, const Json& b, const Json& root) {
  int steps = 0;
  return Disjoint(&a, &b, root, 0, &steps);
}

}  // namespace flotilla::grammar
