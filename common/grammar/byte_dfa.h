// Deterministic automata over the bytes of UTF-8 text: what `pattern` and
// `format` compile to, so that a string's state is one integer and "can this
// prefix still match" is one table lookup (every state kept can reach an
// accepting one; a refused byte leads nowhere).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace flotilla::grammar {

// States 0..size()-1, state 0 the start; next(s, b) == -1 where refused.
class ByteDfa {
 public:
  static constexpr int32_t kDead = -1;

  int size() const { return static_cast<int>(accepting_.size()); }
  int32_t Next(int32_t state, uint8_t byte) const { return next_[state * 256 + byte]; }
  bool Accepting(int32_t state) const { return accepting_[state] != 0; }
  // Whether the language is empty (no state left once pruned).
  bool empty() const { return accepting_.empty(); }

  // Building: states are added, then edges set; Prune() must follow.
  int32_t AddState(bool accepting);
  void SetNext(int32_t state, uint8_t byte, int32_t to) { next_[state * 256 + byte] = to; }
  // Keeps the states reachable from `start` that can reach an accepting
  // state, renumbered so that `start` is 0, then merges equivalent states.
  void Prune(int32_t start);

 private:
  void Minimize();
  std::vector<int32_t> next_;  // [state * 256 + byte]
  std::vector<uint8_t> accepting_;
};

// Strings both accept; `subtract`: strings `a` accepts and `b` does not.
// Refused past `max_states` (RESOURCE_EXHAUSTED).
absl::StatusOr<ByteDfa> Intersect(const ByteDfa& a, const ByteDfa& b, bool subtract,
                                  int max_states);

// Drops the bytes a compact JSON string cannot carry as itself or as a short
// escape (control characters other than \b \t \n \f \r, and DEL), so that a
// matcher that writes them raw or as those escapes never meets a dead end.
void RestrictToJsonText(ByteDfa* dfa);

// The lengths in code points a string may still add from each state, to
// hold minLength / maxLength together with the automaton exactly: a prefix is
// kept only while some completion both matches and has an allowed length.
class LengthTable {
 public:
  // Refused past `max_bits` (states x lengths tracked).
  static absl::StatusOr<LengthTable> Build(const ByteDfa& dfa, int64_t min_length,
                                           int64_t max_length, int64_t max_bits);
  // Whether from `state`, with `count` code points so far, some completion
  // ends with a length in [min_length, max_length].
  bool Feasible(int32_t state, int64_t count) const;

 private:
  int64_t min_ = 0, max_ = -1;
  int64_t cap_ = 0;       // lengths tracked: 0..cap_ (cap_ is "cap_ or more" when no max)
  int64_t words_ = 0;     // per state
  std::vector<uint64_t> bits_;  // [state * words_ + length / 64]
};

}  // namespace flotilla::grammar
