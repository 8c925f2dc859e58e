// The errors harmony's readers return for bad input: INVALID_ARGUMENT with a
// message that starts with where the input went wrong.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace flotilla::harmony {

// "where: what" (a message or request field, e.g. "messages[2].content").
inline absl::Status Invalid(const std::string& where, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(where, ": ", what));
}

// "malformed tool schema at where: why" (a tool's JSON Schema).
inline absl::Status MalformedToolSchema(const std::string& where, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat("malformed tool schema at ", where, ": ", why));
}

}  // namespace flotilla::harmony
