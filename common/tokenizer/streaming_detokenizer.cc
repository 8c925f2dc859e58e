#include "common/tokenizer/streaming_detokenizer.h"

#include "absl/strings/str_cat.h"

namespace flotilla::tokenizer {
namespace {
constexpr char kReplacement[] = "\xEF\xBF\xBD";  // U+FFFD
}  // namespace

absl::StatusOr<std::string> StreamingDetokenizer::Append(TokenId id) {
  auto bytes = tokenizer_->TokenBytes(id);
  if (!bytes.ok()) return bytes.status();
  std::string buf = pending_;
  buf.append(*bytes);
  std::string out;
  size_t pos = 0;
  while (true) {
    bool invalid = false;
    const size_t ok = ValidUtf8Prefix(std::string_view(buf).substr(pos), &invalid);
    out.append(buf, pos, ok);
    pos += ok;
    if (!invalid) break;
    if (invalid_ == InvalidBytes::kError) {
      return absl::InvalidArgumentError(absl::StrCat(
          "token ", id, " completes a byte sequence that is not valid UTF-8"));
    }
    out.append(kReplacement);
    ++pos;
  }
  pending_ = buf.substr(pos);
  return out;
}

absl::StatusOr<std::string> StreamingDetokenizer::Finish() {
  if (pending_.empty()) return std::string();
  if (invalid_ == InvalidBytes::kError) {
    return absl::InvalidArgumentError(absl::StrCat(
        "token stream ended inside a UTF-8 character (", pending_.size(), " byte(s) held back)"));
  }
  pending_.clear();
  return std::string(kReplacement);
}

}  // namespace flotilla::tokenizer
