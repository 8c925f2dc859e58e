// A pushdown matcher of compact JSON (no whitespace) that conforms to a
// CompiledSchema, fed one byte at a time. It never backtracks: anyOf
// alternatives that begin alike are read side by side (a state is a small
// set of frame stacks) until the bytes tell them apart. A MatchState is a
// plain value (frames of fixed size, no heap), so trying a byte is "copy the
// state, Feed, keep or drop" and identical states compare and hash by bytes.
//
// What it enforces: object properties in declared order, required ones
// present, no undeclared ones (records: keys of their key schema), property
// counts; array item counts and tuple positions; string lengths in code
// points, valid UTF-8 and escapes (no lone surrogates), patterns and formats
// on the decoded value (where every state kept can still complete); numbers as
// -?(0|[1-9][0-9]*)(.[0-9]+)? with at most kMaxIntegerDigits / kMaxFractionDigits
// digits and the bounds checked at every digit (a prefix is kept only while
// some completion of it lies within them, so bounds hold exactly, within
// double precision), whole multipleOf exactly; enums and const as literal
// texts; nesting up to kMaxNesting.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "common/grammar/schema.h"

namespace flotilla::grammar {

// Objects and arrays of node -1 are untyped (json_object's members).
enum class FrameKind : uint8_t { kValue, kObject, kArray, kString, kNumber, kLiteral };

struct Frame {
  int32_t node;     // schema node; -1: unconstrained (json_object members, keys)
  FrameKind kind;
  uint8_t phase;
  uint8_t need;     // strings: UTF-8 continuation bytes still due
  uint8_t lo, hi;   // strings: range of the next continuation byte
  uint8_t flags;    // numbers: kNeg, kDot; strings: kSurrogateLead
  int8_t int_digits, frac_digits;
  int32_t count;    // items, code points (clamped), next property, literal position
  int32_t pos;      // objects: bytes of the key text matched; strings: pattern state
  int32_t members;  // objects: properties begun (minProperties / maxProperties)
  uint64_t mask;    // literal or key candidates
  const std::vector<std::string>* literals;
  double int_value, frac_value;
};

// One reading of the bytes so far: a stack of frames, innermost last.
struct MatchStack {
  int depth;  // no initialiser: see MatchState()
  Frame frames[2 * kMaxNesting + 2];

  void CopyFrom(const MatchStack& other) {
    depth = other.depth;
    std::memcpy(frames, other.frames, sizeof(Frame) * depth);
  }
  bool SameAs(const MatchStack& other) const {
    return depth == other.depth && std::memcmp(frames, other.frames, sizeof(Frame) * depth) == 0;
  }
};

// Most readings a state holds: anyOf alternatives that share a prefix are
// read side by side (at most kMaxJointReadings of them, which the schema
// compiler checks), plus room for the readings a byte ends while others fork.
inline constexpr int kMaxReadings = 2 * kMaxJointReadings;

// Every reading of the bytes so far that some conforming document continues.
// Usually one; several while anyOf alternatives that begin alike (two
// objects, integer and number, a string and a string enum) have not yet
// diverged. Identical readings are merged after every byte.
struct MatchState {
  // The readings are left uninitialised: a state is large, and vectors of
  // them (a mask walk's scratch) should only touch the memory they use.
  MatchState() : count(0) {}
  MatchState(const MatchState& other) { CopyFrom(other); }
  MatchState& operator=(const MatchState& other) {
    if (this != &other) CopyFrom(other);
    return *this;
  }

  int count;
  MatchStack readings[kMaxReadings];

  void CopyFrom(const MatchState& other) {
    count = other.count;
    for (int i = 0; i < count; ++i) readings[i].CopyFrom(other.readings[i]);
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
  // Whether no byte can follow (every reading is a whole document).
  bool Finished(const MatchState& state) const;
  // Whether `state` is one reading inside the text of a string with no
  // pattern or format, at a character boundary. Then a token of plain text
  // (VocabularyIndex::AllowPlainText) is taken exactly when its characters
  // fit in `*room` (negative: no bound), and only the other tokens need
  // feeding to find the mask.
  bool PlainStringRoom(const MatchState& state, int64_t* room) const;

 private:
  enum class Outcome { kConsumed, kReject, kDone, kPopRetry, kRetry };
  // Feeds `byte` to reading `index` of `state`; readings it forks into are
  // appended to `state` (and fed later by Feed's loop).
  bool FeedReading(MatchState& state, int index, uint8_t byte) const;
  // Feeds readings [first, count) of `state` after the `live` first ones
  // already kept, then merges readings that are equal.
  bool FeedFrom(MatchState& state, uint8_t byte, int first, int live) const;
  Outcome Step(MatchStack& s, uint8_t b, MatchState& set) const;
  Outcome StepValue(MatchStack& s, uint8_t b, MatchState& set) const;
  Outcome StepObject(MatchStack& s, uint8_t b) const;
  Outcome StepArray(MatchStack& s, uint8_t b) const;
  Outcome StepDeclaredKey(MatchStack& s, const SchemaNode& n, uint8_t b) const;
  // Whether an object (null: untyped) may end before property `next`, with
  // `members` properties written.
  bool MayClose(const SchemaNode* n, int next, int members) const;
  // Whether another property may follow.
  bool MayContinue(const SchemaNode& n, int next, int members) const;
  Outcome StepString(Frame& f, uint8_t b) const;
  // The decoded byte `b` of a string with a pattern / format: false when
  // its automaton refuses it.
  static bool FeedText(Frame& f, const TextConstraint& text, uint8_t b);
  Outcome StepNumber(Frame& f, uint8_t b) const;
  Outcome StepLiteral(Frame& f, uint8_t b) const;
  bool Push(MatchStack& s, FrameKind kind, int node) const;
  // The nodes a value of `node` starting with `b` may be (unions flattened,
  // each once); -1 stands for an unconstrained value. Returns how many.
  int Leaves(int node, uint8_t b, int* out, int max, int hops = 0) const;
  bool Starts(int node, uint8_t b) const;
  uint64_t KeyCandidates(const SchemaNode& n, int next, int members) const;
  bool RequiredLeft(const SchemaNode& n, int next) const;
  bool MultipleWithin(const Frame& f, double lo, double hi) const;
  bool NumberFeasible(const Frame& f) const;
  bool NumberComplete(const Frame& f) const;
  bool LiteralComplete(const Frame& f) const;
  int32_t LengthCap(int node) const;

  const CompiledSchema* schema_;
};

// Whether the matcher of `schema` takes every byte of `text` and may end
// there: `text` is a whole document the schema accepts.
bool MatchesWhole(const CompiledSchema& schema, std::string_view text);

}  // namespace flotilla::grammar
