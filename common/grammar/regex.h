// JSON Schema `pattern` (ECMA-262 regular expressions, the subset a finite
// automaton can hold) -> a ByteDfa over the UTF-8 bytes of the string value.
//
// Supported: literals and escapes (\d \D \w \W \s \S \n \r \t \f \v \0 \xHH
// \uHHHH, identity escapes), `.`, classes ([a-z], [^...], escapes inside),
// groups ((...), (?:...), (?<name>...)), alternation, quantifiers (* + ?
// {n} {n,} {n,m}, lazy or not: the language is the same), `^` / `$` at the
// ends of a top-level alternative, and lookaheads ((?=...), (?!...)) in a
// top-level sequence, where they constrain the rest of the string. A leading
// (?=.{m,n}$) is enforced as a length bound. Refused, by name: backreferences,
// lookbehinds, word boundaries, \p{...}, anchors elsewhere, repetition bounds
// above kMaxRepeat, and automata past a state limit.
//
// As JSON Schema says, a pattern matches anywhere in the string unless
// anchored: `ab` is any string containing "ab".
#pragma once

#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/grammar/byte_dfa.h"

namespace flotilla::grammar {

inline constexpr int kMaxRepeat = 1000;
inline constexpr int kMaxPatternLength = 4096;  // code points

struct PatternLanguage {
  ByteDfa dfa;
  // From a leading (?=.{m,n}$): the string's length in code points.
  int64_t min_length = 0, max_length = -1;
};

// INVALID_ARGUMENT saying what is unsupported (and where in the pattern).
absl::StatusOr<PatternLanguage> CompilePattern(std::string_view pattern, int max_states);

}  // namespace flotilla::grammar
