// A deterministic pushdown matcher of compact JSON (no whitespace) that
// conforms to a CompiledSchema, fed one byte at a time. A MatchState is a
// plain value (frames of fixed size, no heap), so trying a byte is "copy the
// state, Feed, keep or drop" and identical states compare and hash by bytes.
//
// What it enforces: object properties in declared order, required ones
// present, no undeclared ones; array item counts; string lengths in code
// points, valid UTF-8 and escapes (no lone surrogates); numbers as
// -?(0|[1-9][0-9]*)(.[0-9]+)? with at most kMaxIntegerDigits / kMaxFractionDigits
// digits and the bounds checked at every digit (a prefix is kept only while
// some completion of it lies within them, so bounds hold exactly, within
// double precision); enums and const as literal texts; nesting up to kMaxNesting.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "common/grammar/schema.h"

namespace flotilla::grammar {

enum class FrameKind : uint8_t { kValue, kObject, kArray, kString, kNumber, kLiteral,
                                 kAnyObject, kAnyArray };

struct Frame {
  int32_t node;     // schema node; -1: unconstrained (json_object members, keys)
  FrameKind kind;
  uint8_t phase;
  uint8_t need;     // strings: UTF-8 continuation bytes still due
  uint8_t lo, hi;   // strings: range of the next continuation byte
  uint8_t flags;    // numbers: kNeg, kDot; strings: kSurrogateLead
  int8_t int_digits, frac_digits;
  int32_t count;    // items, code points (clamped), next property, literal position
  int32_t pos;      // objects: bytes of the key text matched
  uint64_t mask;    // literal or key candidates
  const std::vector<std::string>* literals;
  double int_value, frac_value;
};

struct MatchState {
  int depth = 0;
  Frame frames[2 * kMaxNesting + 2];

  void CopyFrom(const MatchState& other) {
    depth = other.depth;
    std::memcpy(frames, other.frames, sizeof(Frame) * depth);
  }
  // Bytes that identify the state (for caches).
  std::string Key() const;
};

class JsonMatcher {
 public:
  // `schema` must outlive the matcher.
  explicit JsonMatcher(const CompiledSchema* schema) : schema_(schema) {}

  // Before the first byte: one value of the root schema expected.
  MatchState Start() const;
  // Consumes `byte`; false (state unspecified) when no conforming document
  // continues this way.
  bool Feed(MatchState& state, uint8_t byte) const;
  // Whether the bytes so far are a whole conforming document.
  bool CanEnd(const MatchState& state) const;

 private:
  enum class Outcome { kConsumed, kReject, kDone, kPopRetry, kRetry };
  Outcome Step(MatchState& s, uint8_t b) const;
  Outcome StepValue(MatchState& s, uint8_t b) const;
  Outcome StepObject(MatchState& s, uint8_t b) const;
  Outcome StepArray(MatchState& s, uint8_t b) const;
  Outcome StepAnyObject(MatchState& s, uint8_t b) const;
  Outcome StepAnyArray(MatchState& s, uint8_t b) const;
  Outcome StepString(Frame& f, uint8_t b) const;
  Outcome StepNumber(Frame& f, uint8_t b) const;
  Outcome StepLiteral(Frame& f, uint8_t b) const;
  bool Push(MatchState& s, FrameKind kind, int node) const;
  // The node a value starting with `b` takes (unions resolved), -2 when none.
  int Resolve(int node, uint8_t b, int hops = 0) const;
  bool Starts(int node, uint8_t b) const;
  uint64_t KeyCandidates(const SchemaNode& n, int next) const;
  bool RequiredLeft(const SchemaNode& n, int next) const;
  bool NumberFeasible(const Frame& f) const;
  bool NumberComplete(const Frame& f) const;
  bool LiteralComplete(const Frame& f) const;
  int32_t LengthCap(int node) const;

  const CompiledSchema* schema_;
};

}  // namespace flotilla::grammar
