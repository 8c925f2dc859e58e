#include "common/grammar/json_matcher.h"

#include <algorithm>
#include <cmath>

namespace flotilla::grammar {
namespace {

constexpr uint8_t kNeg = 1, kDot = 2, kSurrogateLead = 4;
// Object / array phases.
constexpr uint8_t kOpen = 0, kFirst = 1, kInKey = 2, kAfterValue = 3, kAfterComma = 4,
                  kAfterKey = 5, kBeforeValue = 6;
// String phases (after the opening quote).
constexpr uint8_t kBody = 1, kEscape = 2, kUnicode = 3;

const std::vector<std::string>& Booleans() {
  static const std::vector<std::string> v = {"true", "false"};
  return v;
}
const std::vector<std::string>& Nulls() {
  static const std::vector<std::string> v = {"null"};
  return v;
}
const std::vector<std::string>& Keywords() {
  static const std::vector<std::string> v = {"true", "false", "null"};
  return v;
}

bool IsDigit(uint8_t b) { return b >= '0' && b <= '9'; }
bool IsHex(uint8_t b) { return IsDigit(b) || (b >= 'a' && b <= 'f') || (b >= 'A' && b <= 'F'); }
uint64_t AllOf(size_t n) { return n >= 64 ? ~0ull : (1ull << n) - 1; }

// Whether a short escape's decoded byte can come next in a string with a
// pattern (so that a backslash never leads to a dead end).
bool EscapeCanFollow(const Frame& f, const TextConstraint& text) {
  for (uint8_t decoded : {'"', '\\', '/', '\b', '\f', '\n', '\r', '\t'}) {
    const int32_t next = text.dfa.Next(f.pos, decoded);
    if (next != ByteDfa::kDead && text.lengths.Feasible(next, f.count + 1)) return true;
  }
  return false;
}

// What a short escape (after the backslash) stands for; 0 for none.
uint8_t ShortEscape(uint8_t b) {
  switch (b) {
    case '"': return '"';
    case '\\': return '\\';
    case '/': return '/';
    case 'b': return '\b';
    case 'f': return '\f';
    case 'n': return '\n';
    case 'r': return '\r';
    case 't': return '\t';
    default: return 0;
  }
}

}  // namespace

std::string MatchState::Key() const {
  std::string key(reinterpret_cast<const char*>(&count), sizeof(count));
  for (int i = 0; i < count; ++i) {
    const MatchStack& r = readings[i];
    key.append(reinterpret_cast<const char*>(&r.depth), sizeof(r.depth));
    for (int d = 0; d < r.depth; ++d) {
      // A schema node's literals are named by the node: the key then holds
      // no address of this matcher's schema, so the same state of another
      // compilation of the same schema has the same key (shared mask caches).
      Frame f;
      std::memcpy(&f, &r.frames[d], sizeof(Frame));  // padding too: it is zeroed at Push
      if (f.literals != &Booleans() && f.literals != &Nulls() && f.literals != &Keywords()) {
        f.literals = nullptr;
      }
      key.append(reinterpret_cast<const char*>(&f), sizeof(Frame));
    }
  }
  return key;
}

MatchState JsonMatcher::Start() const {
  MatchState s;
  s.count = 1;
  s.readings[0].depth = 0;
  Push(s.readings[0], FrameKind::kValue, schema_->root);
  return s;
}

bool JsonMatcher::Push(MatchStack& s, FrameKind kind, int node) const {
  if (s.depth >= static_cast<int>(sizeof(s.frames) / sizeof(Frame))) return false;
  Frame& f = s.frames[s.depth++];
  std::memset(&f, 0, sizeof(f));
  f.kind = kind;
  f.node = node;
  return true;
}

bool JsonMatcher::Feed(MatchState& s, uint8_t b) const {
  // The usual case, kept short (a mask walk feeds millions of bytes): one
  // reading that does not fork.
  if (s.count == 1) {
    const bool ok = FeedReading(s, 0, b);
    if (s.count == 1) return ok;
    return FeedFrom(s, b, 1, ok ? 1 : 0);  // it forked: feed the forks
  }
  return FeedFrom(s, b, 0, 0);
}

bool JsonMatcher::FeedFrom(MatchState& s, uint8_t b, int first, int live) const {
  // s.count grows while readings fork; each fork is fed in its turn.
  for (int i = first; i < s.count; ++i) {
    if (!FeedReading(s, i, b)) continue;
    if (live != i) s.readings[live].CopyFrom(s.readings[i]);
    ++live;
  }
  // Readings that met again (alternatives that ended alike) are one.
  int kept = 0;
  for (int i = 0; i < live; ++i) {
    bool seen = false;
    for (int j = 0; j < kept && !seen; ++j) seen = s.readings[j].SameAs(s.readings[i]);
    if (seen) continue;
    if (kept != i) s.readings[kept].CopyFrom(s.readings[i]);
    ++kept;
  }
  s.count = kept;
  return kept > 0;
}

bool JsonMatcher::FeedReading(MatchState& set, int index, uint8_t b) const {
  MatchStack& s = set.readings[index];
  for (int guard = 0; guard < 4 * kMaxNesting + 8; ++guard) {
    if (s.depth == 0) return false;
    switch (Step(s, b, set)) {
      case Outcome::kReject: return false;
      case Outcome::kConsumed: return true;
      case Outcome::kDone: --s.depth; return true;
      case Outcome::kPopRetry: --s.depth; continue;
      case Outcome::kRetry: continue;
    }
  }
  return false;
}

bool JsonMatcher::CanEnd(const MatchState& s) const {
  for (int i = 0; i < s.count; ++i) {
    const MatchStack& r = s.readings[i];
    if (r.depth == 0) return true;
    if (r.depth != 1) continue;
    const Frame& f = r.frames[0];
    if (f.kind == FrameKind::kNumber && NumberComplete(f)) return true;
    if (f.kind == FrameKind::kLiteral && LiteralComplete(f)) return true;
  }
  return false;
}

bool JsonMatcher::Finished(const MatchState& s) const {
  for (int i = 0; i < s.count; ++i) {
    if (s.readings[i].depth != 0) return false;
  }
  return true;
}

JsonMatcher::Outcome JsonMatcher::Step(MatchStack& s, uint8_t b, MatchState& set) const {
  Frame& f = s.frames[s.depth - 1];
  switch (f.kind) {
    case FrameKind::kValue: return StepValue(s, b, set);
    case FrameKind::kObject: return StepObject(s, b);
    case FrameKind::kArray: return StepArray(s, b);
    case FrameKind::kString: return StepString(f, b);
    case FrameKind::kNumber: return StepNumber(f, b);
    case FrameKind::kLiteral: return StepLiteral(f, b);
  }
  return Outcome::kReject;
}

bool JsonMatcher::Starts(int node, uint8_t b) const {
  const SchemaNode& n = schema_->nodes[node];
  switch (n.kind) {
    case NodeKind::kAny: return b == '{' || (!n.object_only && b != '}' && b != ']');
    case NodeKind::kObject: return b == '{';
    case NodeKind::kArray: return b == '[';
    case NodeKind::kString: return b == '"';
    case NodeKind::kInteger:
    case NodeKind::kNumber: return b == '-' || IsDigit(b);
    case NodeKind::kBoolean: return b == 't' || b == 'f';
    case NodeKind::kNull: return b == 'n';
    case NodeKind::kLiteral:
      for (const std::string& l : n.literals) {
        if (!l.empty() && static_cast<uint8_t>(l[0]) == b) return true;
      }
      return false;
    case NodeKind::kUnion: {
      int leaf;
      return Leaves(node, b, &leaf, 1) > 0;
    }
  }
  return false;
}

int JsonMatcher::Leaves(int node, uint8_t b, int* out, int max, int hops) const {
  if (max <= 0) return 0;
  if (node < 0) {
    out[0] = node;  // unconstrained
    return 1;
  }
  const SchemaNode& n = schema_->nodes[node];
  if (n.kind != NodeKind::kUnion) {
    if (!Starts(node, b)) return 0;
    out[0] = node;
    return 1;
  }
  if (hops > 64) return 0;
  int found = 0;
  for (int a : n.alternatives) {
    int more[kMaxReadings];
    const int k = Leaves(a, b, more, kMaxReadings, hops + 1);
    for (int j = 0; j < k && found < max; ++j) {
      if (std::find(out, out + found, more[j]) == out + found) out[found++] = more[j];
    }
  }
  return found;
}

// A value placeholder becomes the frame of the node the byte starts.
JsonMatcher::Outcome JsonMatcher::StepValue(MatchStack& s, uint8_t b, MatchState& set) const {
  Frame& f = s.frames[s.depth - 1];
  int leaves[kMaxReadings];
  const int found = Leaves(f.node, b, leaves, kMaxReadings);
  if (found == 0) return Outcome::kReject;
  // Alternatives that start alike: this reading takes the first, copies of
  // it (the byte not yet consumed) the others. The schema compiler bounds
  // how many there can be; were there more, refusing them only narrows.
  for (int k = 1; k < found && set.count < kMaxReadings; ++k) {
    MatchStack& fork = set.readings[set.count++];
    fork.CopyFrom(s);
    fork.frames[fork.depth - 1].node = leaves[k];
  }
  const int node = leaves[0];
  const NodeKind kind = node < 0 ? NodeKind::kAny : schema_->nodes[node].kind;
  const bool object_only = node >= 0 && schema_->nodes[node].object_only;
  std::memset(&f, 0, sizeof(f));
  f.node = node;
  auto literal = [&](const std::vector<std::string>* lits) {
    f.kind = FrameKind::kLiteral;
    f.literals = lits;
    f.mask = AllOf(lits->size());
    return Outcome::kRetry;
  };
  // Objects and arrays count towards the nesting limit.
  const int containers = s.depth;
  switch (kind) {
    case NodeKind::kObject: f.kind = FrameKind::kObject; break;
    case NodeKind::kArray: f.kind = FrameKind::kArray; break;
    case NodeKind::kString: f.kind = FrameKind::kString; break;
    case NodeKind::kInteger:
    case NodeKind::kNumber: f.kind = FrameKind::kNumber; break;
    case NodeKind::kBoolean: return literal(&Booleans());
    case NodeKind::kNull: return literal(&Nulls());
    case NodeKind::kLiteral: return literal(&schema_->nodes[node].literals);
    case NodeKind::kUnion: return Outcome::kReject;
    case NodeKind::kAny:
      f.node = -1;
      if (b == '{') {
        f.kind = FrameKind::kObject;
      } else if (object_only) {
        return Outcome::kReject;
      } else if (b == '[') {
        f.kind = FrameKind::kArray;
      } else if (b == '"') {
        f.kind = FrameKind::kString;
      } else if (b == '-' || IsDigit(b)) {
        f.kind = FrameKind::kNumber;
      } else {
        return literal(&Keywords());
      }
      break;
  }
  if ((b == '{' || b == '[') && containers > kMaxNesting) return Outcome::kReject;
  return Outcome::kRetry;
}

// The properties that may come next: from `next` up to the first required
// one (later keys would skip it), and with property counts only those after
// which the count can still end within [minProperties, maxProperties] (the
// required ones after it written, and as many optional ones as wanted).
uint64_t JsonMatcher::KeyCandidates(const SchemaNode& n, int next, int members) const {
  const int size = static_cast<int>(n.properties.size());
  const bool counted = n.min_properties > 0 || n.max_properties >= 0;
  int required_after = 0;
  if (counted) {
    for (int j = next; j < size; ++j) required_after += n.properties[j].required ? 1 : 0;
  }
  uint64_t mask = 0;
  for (int j = next; j < size; ++j) {
    if (n.properties[j].required) --required_after;
    const bool fits = !counted ||
                      ((n.max_properties < 0 || members + 1 + required_after <= n.max_properties) &&
                       members + 1 + (size - j - 1) >= n.min_properties);
    if (fits) mask |= 1ull << j;
    if (n.properties[j].required) break;
  }
  return mask;
}

bool JsonMatcher::RequiredLeft(const SchemaNode& n, int next) const {
  for (int j = next; j < static_cast<int>(n.properties.size()); ++j) {
    if (n.properties[j].required) return true;
  }
  return false;
}

// Objects: a typed one (a schema node) matches its declared keys in order,
// each `"key":` text whole; an untyped one (json_object's members, node -1)
// reads any string key, then ':'. The phases around the keys are shared.
JsonMatcher::Outcome JsonMatcher::StepObject(MatchStack& s, uint8_t b) const {
  Frame& f = s.frames[s.depth - 1];
  const SchemaNode* n = f.node >= 0 ? &schema_->nodes[f.node] : nullptr;
  switch (f.phase) {
    case kOpen:
      if (b != '{') return Outcome::kReject;
      f.phase = kFirst;
      return Outcome::kConsumed;
    case kFirst:
    case kAfterComma:
      if (b == '}' && f.phase == kFirst && MayClose(n, 0, 0)) return Outcome::kDone;
      if (b != '"') return Outcome::kReject;
      if (n == nullptr || n->key_node >= 0) {  // any key, or a record's key
        if (n != nullptr && !MayContinue(*n, f.count, f.members)) return Outcome::kReject;
        ++f.members;
        f.phase = kAfterKey;
        return Push(s, n == nullptr ? FrameKind::kString : FrameKind::kValue,
                    n == nullptr ? -1 : n->key_node)
                   ? Outcome::kRetry
                   : Outcome::kReject;
      }
      f.mask = KeyCandidates(*n, f.count, f.members);
      if (f.mask == 0) return Outcome::kReject;
      ++f.members;
      f.phase = kInKey;
      f.pos = 1;
      return Outcome::kConsumed;
    case kInKey:
      return StepDeclaredKey(s, *n, b);
    case kAfterKey:
      if (b != ':') return Outcome::kReject;
      f.phase = kBeforeValue;
      return Outcome::kConsumed;
    case kBeforeValue:
      f.phase = kAfterValue;
      return Push(s, FrameKind::kValue, n == nullptr ? -1 : n->value_node) ? Outcome::kRetry
                                                                           : Outcome::kReject;
    case kAfterValue:
      if (b == '}') return MayClose(n, f.count, f.members) ? Outcome::kDone : Outcome::kReject;
      if (b != ',' || (n != nullptr && !MayContinue(*n, f.count, f.members))) {
        return Outcome::kReject;
      }
      f.phase = kAfterComma;
      return Outcome::kConsumed;
  }
  return Outcome::kReject;
}

bool JsonMatcher::MayClose(const SchemaNode* n, int next, int members) const {
  return n == nullptr || (!RequiredLeft(*n, next) && members >= n->min_properties);
}

bool JsonMatcher::MayContinue(const SchemaNode& n, int next, int members) const {
  if (n.key_node >= 0) return n.max_properties < 0 || members < n.max_properties;
  return KeyCandidates(n, next, members) != 0;
}

// The next byte of a declared key: the candidates narrow until one key's
// text (its ':' included) is whole, then its value follows.
JsonMatcher::Outcome JsonMatcher::StepDeclaredKey(MatchStack& s, const SchemaNode& n,
                                                  uint8_t b) const {
  Frame& f = s.frames[s.depth - 1];
  const int pos = f.pos;
  uint64_t mask = 0;
  int done = -1;
  for (int j = 0; j < 64 && (f.mask >> j); ++j) {
    if (!((f.mask >> j) & 1)) continue;
    const std::string& key = n.properties[j].key_text;
    if (static_cast<int>(key.size()) > pos && static_cast<uint8_t>(key[pos]) == b) {
      mask |= 1ull << j;
      if (static_cast<int>(key.size()) == pos + 1) done = j;
    }
  }
  if (mask == 0) return Outcome::kReject;
  f.mask = mask;
  f.pos = pos + 1;
  if (done < 0) return Outcome::kConsumed;
  f.count = done + 1;
  f.phase = kAfterValue;
  f.mask = 0;
  f.pos = 0;
  return Push(s, FrameKind::kValue, n.properties[done].node) ? Outcome::kConsumed
                                                             : Outcome::kReject;
}

// Arrays: a typed one counts its items against minItems / maxItems; an
// untyped one (node -1) takes any values and does not count them, so that
// its states stay few (and masks cached) however long it grows.
JsonMatcher::Outcome JsonMatcher::StepArray(MatchStack& s, uint8_t b) const {
  Frame& f = s.frames[s.depth - 1];
  const SchemaNode* n = f.node >= 0 ? &schema_->nodes[f.node] : nullptr;
  const int64_t min_items = n != nullptr ? n->min_items : 0;
  const int64_t max_items = n != nullptr ? n->max_items : -1;
  switch (f.phase) {
    case kOpen:
      if (b != '[') return Outcome::kReject;
      f.phase = kFirst;
      return Outcome::kConsumed;
    case kFirst:
      if (b == ']') return min_items == 0 ? Outcome::kDone : Outcome::kReject;
      if (max_items == 0) return Outcome::kReject;
      [[fallthrough]];
    case kAfterComma: {
      int item = -1;
      if (n != nullptr) {
        ++f.count;
        item = f.count <= static_cast<int>(n->prefix_items.size()) ? n->prefix_items[f.count - 1]
                                                                  : n->items;
      }
      f.phase = kAfterValue;
      return Push(s, FrameKind::kValue, item) ? Outcome::kRetry : Outcome::kReject;
    }
    case kAfterValue:
      if (b == ']') return f.count >= min_items ? Outcome::kDone : Outcome::kReject;
      if (b != ',' || (max_items >= 0 && f.count >= max_items)) return Outcome::kReject;
      f.phase = kAfterComma;
      return Outcome::kConsumed;
  }
  return Outcome::kReject;
}

bool JsonMatcher::PlainStringRoom(const MatchState& state, int64_t* room) const {
  if (state.count != 1 || state.readings[0].depth == 0) return false;
  const MatchStack& s = state.readings[0];
  const Frame& f = s.frames[s.depth - 1];
  if (f.kind != FrameKind::kString || f.phase != kBody || f.need != 0) return false;
  const SchemaNode* node = f.node >= 0 ? &schema_->nodes[f.node] : nullptr;
  if (node != nullptr && node->text != nullptr) return false;
  // StepString takes a character's first byte while count < max_length.
  const int64_t max_len = node != nullptr ? node->max_length : -1;
  *room = max_len < 0 ? -1 : std::max<int64_t>(0, max_len - f.count);
  return true;
}

int32_t JsonMatcher::LengthCap(int node) const {
  if (node < 0) return 0;
  const SchemaNode& n = schema_->nodes[node];
  return static_cast<int32_t>(std::max<int64_t>(n.min_length, n.max_length));
}

bool JsonMatcher::FeedText(Frame& f, const TextConstraint& text, uint8_t b) {
  const int32_t next = text.dfa.Next(f.pos, b);
  if (next == ByteDfa::kDead) return false;
  f.pos = next;
  return true;
}

JsonMatcher::Outcome JsonMatcher::StepString(Frame& f, uint8_t b) const {
  const SchemaNode* node = f.node >= 0 ? &schema_->nodes[f.node] : nullptr;
  const int64_t min_len = node != nullptr ? node->min_length : 0;
  const int64_t max_len = node != nullptr ? node->max_length : -1;
  const TextConstraint* text = node != nullptr ? node->text.get() : nullptr;
  const bool room = max_len < 0 || f.count < max_len;
  // With a pattern: the decoded byte must be one its automaton takes, and
  // some completion must still match within the length bounds.
  auto feed = [&](uint8_t decoded) { return text == nullptr || FeedText(f, *text, decoded); };
  auto feasible = [&](Outcome o) {
    if (text == nullptr || o == Outcome::kReject) return o;
    return text->lengths.Feasible(f.pos, f.count + (f.need > 0 ? 1 : 0)) ? o : Outcome::kReject;
  };
  auto counted = [&] {
    f.count = std::min(f.count + 1, LengthCap(f.node));
    return Outcome::kConsumed;
  };
  if (f.phase == kOpen) {
    if (b != '"') return Outcome::kReject;
    f.phase = kBody;
    return Outcome::kConsumed;
  }
  if (f.phase == kEscape) {
    if (b == 'u' && text == nullptr) {  // with a pattern only short escapes are written
      f.phase = kUnicode;
      f.need = 0;
      return Outcome::kConsumed;
    }
    const uint8_t decoded = ShortEscape(b);
    if (decoded == 0 || !feed(decoded)) return Outcome::kReject;
    f.phase = kBody;
    return feasible(counted());
  }
  if (f.phase == kUnicode) {
    if (!IsHex(b)) return Outcome::kReject;
    // No surrogates (\uD800-\uDFFF): a lone one is not valid Unicode text.
    if (f.need == 0 && (b == 'd' || b == 'D')) f.flags |= kSurrogateLead;
    if (f.need == 1 && (f.flags & kSurrogateLead) && !(b >= '0' && b <= '7')) {
      return Outcome::kReject;
    }
    if (++f.need < 4) return Outcome::kConsumed;
    f.need = 0;
    f.flags = 0;
    f.phase = kBody;
    return counted();
  }
  if (f.need > 0) {  // inside a multi-byte UTF-8 sequence
    if (b < f.lo || b > f.hi || !feed(b)) return Outcome::kReject;
    f.lo = 0x80;
    f.hi = 0xBF;
    return feasible(--f.need == 0 ? counted() : Outcome::kConsumed);
  }
  if (b == '"') {
    if (text != nullptr && !text->dfa.Accepting(f.pos)) return Outcome::kReject;
    return f.count >= min_len ? Outcome::kDone : Outcome::kReject;
  }
  if (!room || b < 0x20 || b == 0x7F) return Outcome::kReject;
  if (b == '\\') {  // with a pattern, only when some short escape can follow
    if (text != nullptr && !EscapeCanFollow(f, *text)) return Outcome::kReject;
    f.phase = kEscape;
    return Outcome::kConsumed;
  }
  if (b < 0x80) return feed(b) ? feasible(counted()) : Outcome::kReject;
  f.lo = 0x80;
  f.hi = 0xBF;
  if (b >= 0xC2 && b <= 0xDF) {
    f.need = 1;
  } else if (b >= 0xE0 && b <= 0xEF) {
    f.need = 2;
    if (b == 0xE0) f.lo = 0xA0;
    if (b == 0xED) f.hi = 0x9F;
  } else if (b >= 0xF0 && b <= 0xF4) {
    f.need = 3;
    if (b == 0xF0) f.lo = 0x90;
    if (b == 0xF4) f.hi = 0x8F;
  } else {
    return Outcome::kReject;
  }
  return feed(b) ? feasible(Outcome::kConsumed) : Outcome::kReject;
}

bool JsonMatcher::NumberComplete(const Frame& f) const {
  if (f.int_digits == 0 || ((f.flags & kDot) && f.frac_digits == 0)) return false;
  if (f.node < 0) return true;
  const SchemaNode& n = schema_->nodes[f.node];
  double v = f.int_value + f.frac_value;
  if (f.flags & kNeg) v = -v;
  if (n.minimum && (n.exclusive_minimum ? v <= *n.minimum : v < *n.minimum)) return false;
  if (n.maximum && (n.exclusive_maximum ? v >= *n.maximum : v > *n.maximum)) return false;
  return n.multiple_of == 0 || static_cast<int64_t>(f.int_value) % n.multiple_of == 0;
}

// Whether an integer in [lo, hi] (and within the bounds) is a multiple of
// the node's multipleOf; the values are whole and below 2^53, so exact.
bool JsonMatcher::MultipleWithin(const Frame& f, double lo, double hi) const {
  const SchemaNode& n = schema_->nodes[f.node];
  if (n.minimum) lo = std::max(lo, n.exclusive_minimum ? std::floor(*n.minimum) + 1 : std::ceil(*n.minimum));
  if (n.maximum) hi = std::min(hi, n.exclusive_maximum ? std::ceil(*n.maximum) - 1 : std::floor(*n.maximum));
  if (lo > hi) return false;
  const int64_t low = static_cast<int64_t>(lo), high = static_cast<int64_t>(hi), m = n.multiple_of;
  const int64_t below = high >= 0 ? high / m : -((-high + m - 1) / m);  // floor(high / m)
  return below * m >= low;
}

// Whether some completion of the digits so far lies within the bounds: the
// reachable magnitudes are unions of intervals (one per count of further
// integer digits), each checked against the bounds.
bool JsonMatcher::NumberFeasible(const Frame& f) const {
  if (f.node < 0) return true;
  const SchemaNode& n = schema_->nodes[f.node];
  if (!n.minimum && !n.maximum && n.multiple_of == 0) return true;
  const bool integer = n.kind == NodeKind::kInteger;
  const double frac_room = integer ? 0.0 : 1.0 - std::pow(10.0, -kMaxFractionDigits);
  auto fits = [&](double lo, double hi) {  // magnitudes [lo, hi]
    double vlo = lo, vhi = hi;
    if (f.flags & kNeg) vlo = -hi, vhi = -lo;
    if (n.minimum && (n.exclusive_minimum ? vhi <= *n.minimum : vhi < *n.minimum)) return false;
    if (n.maximum && (n.exclusive_maximum ? vlo >= *n.maximum : vlo > *n.maximum)) return false;
    return n.multiple_of == 0 || MultipleWithin(f, vlo, vhi);
  };
  if (f.flags & kDot) {
    const double base = f.int_value + f.frac_value;
    const double room = std::pow(10.0, -f.frac_digits) - std::pow(10.0, -kMaxFractionDigits);
    return fits(base, base + std::max(room, 0.0));
  }
  if (f.int_digits == 0) return fits(0.0, std::pow(10.0, kMaxIntegerDigits));
  const bool zero = f.int_value == 0.0;
  const int more = zero ? 0 : kMaxIntegerDigits - f.int_digits;
  double scale = 1.0;
  for (int j = 0; j <= more; ++j, scale *= 10.0) {
    if (fits(f.int_value * scale, f.int_value * scale + (scale - 1.0) + frac_room)) return true;
  }
  return false;
}

JsonMatcher::Outcome JsonMatcher::StepNumber(Frame& f, uint8_t b) const {
  const bool integer = f.node >= 0 && schema_->nodes[f.node].kind == NodeKind::kInteger;
  if (b == '-' && f.int_digits == 0 && !(f.flags & kNeg)) {
    f.flags |= kNeg;
  } else if (IsDigit(b)) {
    const int d = b - '0';
    if (!(f.flags & kDot)) {
      if (f.int_digits == kMaxIntegerDigits || (f.int_digits == 1 && f.int_value == 0.0)) {
        return Outcome::kReject;
      }
      f.int_value = f.int_value * 10.0 + d;
      ++f.int_digits;
    } else {
      if (f.frac_digits == kMaxFractionDigits) return Outcome::kReject;
      ++f.frac_digits;
      f.frac_value += d * std::pow(10.0, -f.frac_digits);
    }
  } else if (b == '.' && !integer && !(f.flags & kDot) && f.int_digits > 0) {
    f.flags |= kDot;
  } else {
    return NumberComplete(f) ? Outcome::kPopRetry : Outcome::kReject;
  }
  return NumberFeasible(f) ? Outcome::kConsumed : Outcome::kReject;
}

bool JsonMatcher::LiteralComplete(const Frame& f) const {
  for (size_t j = 0; j < f.literals->size(); ++j) {
    if (((f.mask >> j) & 1) && static_cast<int>((*f.literals)[j].size()) == f.count) return true;
  }
  return false;
}

JsonMatcher::Outcome JsonMatcher::StepLiteral(Frame& f, uint8_t b) const {
  const std::vector<std::string>& lits = *f.literals;
  uint64_t mask = 0;
  bool longer = false;
  for (size_t j = 0; j < lits.size(); ++j) {
    if (!((f.mask >> j) & 1)) continue;
    if (static_cast<int>(lits[j].size()) > f.count && static_cast<uint8_t>(lits[j][f.count]) == b) {
      mask |= 1ull << j;
      longer = longer || static_cast<int>(lits[j].size()) > f.count + 1;
    }
  }
  if (mask == 0) return LiteralComplete(f) && f.count > 0 ? Outcome::kPopRetry : Outcome::kReject;
  f.mask = mask;
  ++f.count;
  return longer ? Outcome::kConsumed : Outcome::kDone;
}

bool MatchesWhole(const CompiledSchema& schema, std::string_view text) {
  JsonMatcher matcher(&schema);
  MatchState state = matcher.Start();
  for (char c : text) {
    if (!matcher.Feed(state, static_cast<uint8_t>(c))) return false;
  }
  return matcher.CanEnd(state);
}

}  // namespace flotilla::grammar
