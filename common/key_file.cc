#include "common/key_file.h"

#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace flotilla {

absl::StatusOr<std::vector<std::string>> ReadKeyFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read the key file ", path));
  std::vector<std::string> keys;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    const std::string key(absl::StripAsciiWhitespace(line));
    if (key.empty() || key.front() == '#') continue;
    for (char c : key) {
      if (absl::ascii_isspace(static_cast<unsigned char>(c)) ||
          absl::ascii_iscntrl(static_cast<unsigned char>(c))) {
        return absl::InvalidArgumentError(absl::StrCat(
            path, ":", number, ": a key may not contain whitespace or control characters"));
      }
    }
    keys.push_back(key);
  }
  if (in.bad()) return absl::DataLossError(absl::StrCat("cannot read the key file ", path));
  if (keys.empty())
    return absl::InvalidArgumentError(absl::StrCat("the key file ", path, " holds no key"));
  return keys;
}

}  // namespace flotilla
