// The syntax of JSON Schema `pattern`s (ECMA-262, the subset regex.h lists):
// a pattern's text -> a tree of Nodes (classes of code points, sequences,
// alternations, repetitions, anchors, lookaheads), and the code point sets
// the escapes and classes stand for. regex.cc compiles the tree to automata.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace flotilla::grammar::regex_syntax {

using Ranges = std::vector<std::pair<char32_t, char32_t>>;  // code points, inclusive

struct Node {
  enum Kind { kEmpty, kClass, kConcat, kAlt, kRepeat, kBegin, kEnd, kLookahead };
  Kind kind = kEmpty;
  Ranges ranges;                // kClass
  std::vector<Node> children;   // kConcat, kAlt; kRepeat and kLookahead: one
  int min = 0, max = -1;        // kRepeat; max -1: unbounded
  bool negative = false;        // kLookahead
};

// Sorted, merged ranges.
Ranges Normalize(Ranges r);
// Every code point of valid UTF-8 text but those in `r` (no surrogates).
Ranges Complement(const Ranges& r);
// What `.` does not match.
Ranges LineTerminators();
Node ClassNode(Ranges r);
Node RepeatNode(Node child, int min, int max);
// Any string: what an unanchored end of a pattern adds.
Node AnyString();

// The pattern's code points (it is UTF-8 from JSON); INVALID_ARGUMENT if not.
absl::StatusOr<std::u32string> DecodeUtf8(std::string_view text);
// The tree of a pattern; INVALID_ARGUMENT naming what is unsupported and
// where ("unsupported backreference at offset 3").
absl::StatusOr<Node> ParsePattern(std::u32string text);

}  // namespace flotilla::grammar::regex_syntax
