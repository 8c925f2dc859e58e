// Key files: the API and admin keys a coordinator accepts, and the key a
// local cluster's own tools present.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace flotilla {

// Reads one key per line; blank lines and lines starting with '#' are
// skipped, and surrounding spaces, tabs and '\r' are trimmed. A file that
// cannot be read, holds no key, or has a key with whitespace inside is an
// error naming the file (and the line).
absl::StatusOr<std::vector<std::string>> ReadKeyFile(const std::string& path);

}  // namespace flotilla
