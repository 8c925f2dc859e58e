#include "tools/cli/harmony_cli_util.h"

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace flotilla::cli {

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read '", path, "'"));
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

absl::StatusOr<std::unique_ptr<tokenizer::Tokenizer>> LoadTokenizer(const std::string& path) {
  return tokenizer::Tokenizer::Create(path.empty() ? tokenizer::Tokenizer::DefaultRanksPath() : path);
}

}  // namespace flotilla::cli
