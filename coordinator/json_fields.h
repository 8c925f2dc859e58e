// Reading request JSON in the OpenAI-shaped APIs (chat completions,
// completions, Responses, tokenize, the gRPC Chat translation): the error a
// field check returns, the lookups they share and the `model` check.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace flotilla::coordinator::json_fields {

using Json = nlohmann::ordered_json;

// INVALID_ARGUMENT "field: what"; ErrorFromStatus makes `field` the error's
// `param`.
inline absl::Status Invalid(const std::string& field, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
}

// The member `key` of `object`; null when it is absent or JSON null (both
// mean "not given").
inline const Json* Field(const Json& object, const char* key) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return nullptr;
  return &*it;
}

// The string member `key` of the object at `where`, which must be there.
inline absl::StatusOr<std::string> RequiredString(const Json& object, const char* key,
                                                  const std::string& where) {
  const Json* v = Field(object, key);
  if (v == nullptr || !v->is_string()) {
    return Invalid(absl::StrCat(where, ".", key), "is required (a string)");
  }
  return v->get<std::string>();
}

// OK when the request's `model` names the served model `model_id`. Absent or
// null: INVALID_ARGUMENT "model: is required" where `required`, else OK (the
// served one is meant). Another name: NOT_FOUND, as the OpenAI API answers a
// model it does not have.
inline absl::Status CheckModel(const Json& body, std::string_view model_id, bool required = true) {
  const Json* m = Field(body, "model");
  if (m == nullptr) return required ? Invalid("model", "is required") : absl::OkStatus();
  if (!m->is_string()) return Invalid("model", "must be a string");
  if (m->get_ref<const std::string&>() != model_id) {
    return absl::NotFoundError(absl::StrCat("model: the model '", m->get_ref<const std::string&>(),
                                            "' does not exist; this server serves '",
                                            std::string(model_id), "'"));
  }
  return absl::OkStatus();
}

}  // namespace flotilla::coordinator::json_fields
