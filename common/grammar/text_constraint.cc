#include "common/grammar/text_constraint.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/grammar/regex.h"
#include "common/grammar/string_formats.h"

namespace flotilla::grammar {
namespace {

absl::Status Refuse(const std::string& keyword, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(keyword, ": ", why));
}

// zod writes these format names beside the pattern that carries their whole
// meaning (`.includes()`, `.startsWith()`, `.endsWith()`).
bool IsPatternAnnotation(const std::string& format) {
  return format == "includes" || format == "starts_with" || format == "ends_with";
}

}  // namespace

absl::StatusOr<std::shared_ptr<const TextConstraint>> CompileTextConstraint(
    const TextRequest& request) {
  auto text = std::make_shared<TextConstraint>();
  int64_t min_length = request.min_length, max_length = request.max_length;
  std::optional<ByteDfa> dfa;
  auto add = [&](const std::string& keyword, const std::string& pattern) -> absl::Status {
    absl::StatusOr<PatternLanguage> language = CompilePattern(pattern, kMaxTextStates);
    if (!language.ok()) return Refuse(keyword, language.status().message());
    min_length = std::max(min_length, language->min_length);
    if (language->max_length >= 0) {
      max_length = max_length < 0 ? language->max_length : std::min(max_length, language->max_length);
    }
    if (!dfa) {
      dfa = std::move(language->dfa);
      return absl::OkStatus();
    }
    absl::StatusOr<ByteDfa> both = Intersect(*dfa, language->dfa, false, kMaxTextStates);
    if (!both.ok()) return Refuse(keyword, both.status().message());
    dfa = *std::move(both);
    return absl::OkStatus();
  };
  const bool patterns = !request.patterns.empty();
  if (request.format && !(patterns && IsPatternAnnotation(*request.format))) {
    absl::StatusOr<std::string> pattern = FormatPattern(*request.format);
    if (!pattern.ok()) return Refuse("format", pattern.status().message());
    if (absl::Status st = add("format", *pattern); !st.ok()) return st;
  }
  for (const std::string& pattern : request.patterns) {
    if (absl::Status st = add("pattern", pattern); !st.ok()) return st;
  }
  const std::string what = patterns && request.format ? "pattern and format"
                           : patterns                  ? "pattern"
                                                       : "format";
  if (dfa->empty()) {
    return Refuse(what, patterns && request.format
                            ? absl::StrCat("no string matches both (format '", *request.format, "')")
                            : "no string a JSON string can carry matches");
  }
  if (max_length >= 0 && min_length > max_length) {
    return Refuse(what, "its length bounds and minLength/maxLength exclude each other");
  }
  absl::StatusOr<LengthTable> lengths =
      LengthTable::Build(*dfa, min_length, max_length, kMaxLengthBits);
  if (!lengths.ok()) return Refuse(what, lengths.status().message());
  if (!lengths->Feasible(0, 0)) {
    return Refuse(what, "no matching string has a length within minLength/maxLength");
  }
  text->dfa = *std::move(dfa);
  text->lengths = *std::move(lengths);
  text->min_length = min_length;
  text->max_length = max_length;
  return std::shared_ptr<const TextConstraint>(std::move(text));
}

}  // namespace flotilla::grammar
