// A string node's `pattern` and `format` -> one TextConstraint: the two
// automata intersected, restricted to what a JSON string can carry, with the
// length bounds tracked beside it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/grammar/schema.h"

namespace flotilla::grammar {

struct TextRequest {
  std::vector<std::string> patterns;  // `pattern`, and those of an allOf: all must match
  std::optional<std::string> format;
  int64_t min_length = 0, max_length = -1;  // code points; -1: none
};

// INVALID_ARGUMENT naming the keyword at fault ("pattern: ...", "format: ...")
// when it cannot be enforced, or when no string satisfies all at once.
absl::StatusOr<std::shared_ptr<const TextConstraint>> CompileTextConstraint(
    const TextRequest& request);

}  // namespace flotilla::grammar
