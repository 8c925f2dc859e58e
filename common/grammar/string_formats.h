// JSON Schema `format` names -> the patterns that enforce them. Each pattern
// accepts only strings that the format's RFC allows (a strict subset where the
// full grammar would make a large automaton: ASCII host names, URIs with an
// authority, no IPv4-in-IPv6 forms), so that any validator of the format
// accepts what is generated.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace flotilla::grammar {

// NOT_FOUND for a format that is not enforced (the message lists those that are).
absl::StatusOr<std::string> FormatPattern(std::string_view format);

}  // namespace flotilla::grammar
