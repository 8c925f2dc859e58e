#include "common/grammar/regex_syntax.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/grammar/regex.h"

namespace flotilla::grammar::regex_syntax {
namespace {

constexpr char32_t kMaxCodePoint = 0x10FFFF;
constexpr int kMaxDepth = 64;

Ranges Digits() { return {{'0', '9'}}; }
Ranges WordChars() { return {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}}; }
Ranges Spaces() {
  return {{'\t', '\r'}, {' ', ' '}, {0xA0, 0xA0}, {0x1680, 0x1680}, {0x2000, 0x200A},
          {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000},
          {0xFEFF, 0xFEFF}};
}

// --- Parsing: the pattern's code points -> a Node tree --------------------

class Parser {
 public:
  explicit Parser(std::u32string text) : text_(std::move(text)) {}

  absl::StatusOr<Node> Run() {
    absl::StatusOr<Node> n = Alternation(0);
    if (!n.ok()) return n;
    if (pos_ < text_.size()) return Bad("unbalanced ')'");
    return n;
  }

 private:
  absl::Status Bad(const std::string& what) const {
    return absl::InvalidArgumentError(absl::StrCat(what, " at offset ", pos_));
  }
  bool More() const { return pos_ < text_.size(); }
  char32_t Peek() const { return text_[pos_]; }
  bool Eat(char32_t c) {
    if (!More() || Peek() != c) return false;
    ++pos_;
    return true;
  }

  absl::StatusOr<Node> Alternation(int depth) {
    if (depth > kMaxDepth) return Bad("groups nested too deeply");
    Node alt;
    alt.kind = Node::kAlt;
    for (;;) {
      absl::StatusOr<Node> seq = Sequence(depth);
      if (!seq.ok()) return seq;
      alt.children.push_back(*std::move(seq));
      if (!Eat('|')) break;
    }
    if (alt.children.size() == 1) return std::move(alt.children[0]);
    return alt;
  }

  absl::StatusOr<Node> Sequence(int depth) {
    Node seq;
    seq.kind = Node::kConcat;
    while (More() && Peek() != '|' && Peek() != ')') {
      absl::StatusOr<Node> atom = Atom(depth);
      if (!atom.ok()) return atom;
      absl::StatusOr<Node> quantified = Quantifier(*std::move(atom));
      if (!quantified.ok()) return quantified;
      seq.children.push_back(*std::move(quantified));
    }
    if (seq.children.size() == 1) return std::move(seq.children[0]);
    return seq;
  }

  // {n}, {n,} or {n,m} at pos_ (past the '{'); false when it is not one
  // (then '{' is a literal, as in ECMAScript without the u flag).
  bool Bounds(int* min, int* max) {
    size_t p = pos_;
    auto number = [&](int* out) {
      const size_t begin = p;
      int64_t v = 0;
      while (p < text_.size() && text_[p] >= '0' && text_[p] <= '9') {
        v = std::min<int64_t>(v * 10 + (text_[p] - '0'), 1 << 30);
        ++p;
      }
      *out = static_cast<int>(v);
      return p > begin;
    };
    if (!number(min)) return false;
    *max = *min;
    if (p < text_.size() && text_[p] == ',') {
      ++p;
      if (!number(max)) *max = -1;
    }
    if (p >= text_.size() || text_[p] != '}') return false;
    pos_ = p + 1;
    return true;
  }

  absl::StatusOr<Node> Quantifier(Node atom) {
    if (!More()) return atom;
    int min = 0, max = -1;
    const char32_t c = Peek();
    if (c == '*' || c == '+' || c == '?') {
      ++pos_;
      min = c == '+' ? 1 : 0;
      max = c == '?' ? 1 : -1;
    } else if (c == '{') {
      ++pos_;
      if (!Bounds(&min, &max)) {
        --pos_;
        return atom;
      }
      if (max >= 0 && min > max) return Bad("repetition {n,m} with n above m");
      if (min > kMaxRepeat || max > kMaxRepeat) {
        return Bad(absl::StrCat("repetition bound above ", kMaxRepeat));
      }
    } else {
      return atom;
    }
    Eat('?');  // lazy: the same language
    if (atom.kind == Node::kBegin || atom.kind == Node::kEnd || atom.kind == Node::kLookahead) {
      return Bad("a quantifier on an assertion");
    }
    return RepeatNode(std::move(atom), min, max);
  }

  absl::StatusOr<Node> Group(int depth) {
    Node look;
    if (Eat('?')) {
      if (Eat(':')) {
      } else if (Eat('=') || Eat('!')) {
        look.kind = Node::kLookahead;
        look.negative = text_[pos_ - 1] == '!';
      } else if (Eat('<')) {
        if (More() && (Peek() == '=' || Peek() == '!')) return Bad("unsupported lookbehind");
        while (More() && Peek() != '>') ++pos_;  // a named group
        if (!Eat('>')) return Bad("unterminated group name");
      } else {
        return Bad("unsupported group syntax '(?'");
      }
    }
    absl::StatusOr<Node> inner = Alternation(depth + 1);
    if (!inner.ok()) return inner;
    if (!Eat(')')) return Bad("missing ')'");
    if (look.kind != Node::kLookahead) return inner;
    look.children.push_back(*std::move(inner));
    return look;
  }

  absl::StatusOr<Node> Atom(int depth) {
    const char32_t c = text_[pos_++];
    switch (c) {
      case '(': return Group(depth);
      case '[': return Class();
      case '.': return ClassNode(Complement(LineTerminators()));
      case '^': {
        Node n;
        n.kind = Node::kBegin;
        return n;
      }
      case '$': {
        Node n;
        n.kind = Node::kEnd;
        return n;
      }
      case '\\': {
        absl::StatusOr<Ranges> r = Escape(false);
        if (!r.ok()) return r.status();
        return ClassNode(*std::move(r));
      }
      case '*': case '+': case '?': return Bad("a quantifier with nothing before it");
      case ')': return Bad("unbalanced ')'");
      default: return ClassNode({{c, c}});
    }
  }

  absl::StatusOr<char32_t> Hex(int digits) {
    char32_t v = 0;
    for (int i = 0; i < digits; ++i) {
      if (!More()) return Bad("a short hexadecimal escape");
      const char32_t h = text_[pos_++];
      int d;
      if (h >= '0' && h <= '9') {
        d = h - '0';
      } else if (h >= 'a' && h <= 'f') {
        d = h - 'a' + 10;
      } else if (h >= 'A' && h <= 'F') {
        d = h - 'A' + 10;
      } else {
        return Bad("a bad hexadecimal escape");
      }
      v = v * 16 + d;
    }
    return v;
  }

  // After a backslash: the code points it stands for.
  absl::StatusOr<Ranges> Escape(bool in_class) {
    if (!More()) return Bad("a pattern ending in '\\'");
    const char32_t c = text_[pos_++];
    switch (c) {
      case 'd': return Digits();
      case 'D': return Complement(Digits());
      case 'w': return WordChars();
      case 'W': return Complement(WordChars());
      case 's': return Spaces();
      case 'S': return Complement(Spaces());
      case 'n': return Ranges{{'\n', '\n'}};
      case 'r': return Ranges{{'\r', '\r'}};
      case 't': return Ranges{{'\t', '\t'}};
      case 'f': return Ranges{{'\f', '\f'}};
      case 'v': return Ranges{{'\v', '\v'}};
      case '0': return Ranges{{0, 0}};
      case 'x':
      case 'u': {
        absl::StatusOr<char32_t> v = Hex(c == 'x' ? 2 : 4);
        if (!v.ok()) return v.status();
        return Ranges{{*v, *v}};
      }
      case 'b':
        if (in_class) return Ranges{{'\b', '\b'}};
        return Bad("unsupported word boundary '\\b'");
      case 'B': return Bad("unsupported word boundary '\\B'");
      case 'p': case 'P': return Bad("unsupported Unicode property escape");
      case 'k': return Bad("unsupported backreference '\\k'");
      case 'c': return Bad("unsupported control escape '\\c'");
      default:
        if (c >= '1' && c <= '9') return Bad("unsupported backreference");
        return Ranges{{c, c}};
    }
  }

  absl::StatusOr<Node> Class() {
    const bool negated = Eat('^');
    Ranges ranges;
    while (More() && Peek() != ']') {
      absl::StatusOr<Ranges> lo = ClassAtom();
      if (!lo.ok()) return lo.status();
      const bool single = lo->size() == 1 && (*lo)[0].first == (*lo)[0].second;
      if (single && pos_ + 1 < text_.size() && Peek() == '-' && text_[pos_ + 1] != ']') {
        ++pos_;
        absl::StatusOr<Ranges> hi = ClassAtom();
        if (!hi.ok()) return hi.status();
        if (hi->size() != 1 || (*hi)[0].first != (*hi)[0].second) {
          return Bad("a class range ending in a class escape");
        }
        if ((*hi)[0].first < (*lo)[0].first) return Bad("a class range out of order");
        ranges.emplace_back((*lo)[0].first, (*hi)[0].first);
        continue;
      }
      ranges.insert(ranges.end(), lo->begin(), lo->end());
    }
    if (!Eat(']')) return Bad("missing ']'");
    return ClassNode(negated ? Complement(ranges) : ranges);
  }

  absl::StatusOr<Ranges> ClassAtom() {
    const char32_t c = text_[pos_++];
    if (c == '\\') return Escape(true);
    return Ranges{{c, c}};
  }

  std::u32string text_;
  size_t pos_ = 0;
};

}  // namespace

Ranges Normalize(Ranges r) {
  std::sort(r.begin(), r.end());
  Ranges out;
  for (const auto& [lo, hi] : r) {
    if (!out.empty() && lo <= out.back().second + 1) {
      out.back().second = std::max(out.back().second, hi);
    } else {
      out.emplace_back(lo, hi);
    }
  }
  return out;
}

Ranges Complement(const Ranges& r) {
  Ranges out;
  char32_t next = 0;
  for (const auto& [lo, hi] : Normalize(r)) {
    if (lo > next) out.emplace_back(next, lo - 1);
    next = hi + 1;
  }
  if (next <= kMaxCodePoint) out.emplace_back(next, kMaxCodePoint);
  Ranges no_surrogates;
  for (const auto& [lo, hi] : out) {
    if (hi < 0xD800 || lo > 0xDFFF) {
      no_surrogates.emplace_back(lo, hi);
      continue;
    }
    if (lo < 0xD800) no_surrogates.emplace_back(lo, 0xD7FF);
    if (hi > 0xDFFF) no_surrogates.emplace_back(0xE000, hi);
  }
  return no_surrogates;
}

Ranges LineTerminators() { return {{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}}; }

Node ClassNode(Ranges r) {
  Node n;
  n.kind = Node::kClass;
  n.ranges = Normalize(std::move(r));
  return n;
}
Node RepeatNode(Node child, int min, int max) {
  Node n;
  n.kind = Node::kRepeat;
  n.min = min, n.max = max;
  n.children.push_back(std::move(child));
  return n;
}
Node AnyString() { return RepeatNode(ClassNode(Complement({})), 0, -1); }

absl::StatusOr<std::u32string> DecodeUtf8(std::string_view text) {
  std::u32string out;
  for (size_t i = 0; i < text.size();) {
    const uint8_t b = static_cast<uint8_t>(text[i]);
    const int n = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > text.size()) return absl::InvalidArgumentError("not UTF-8");
    char32_t c = n == 1 ? b : b & (0x7F >> n);
    for (int k = 1; k < n; ++k) c = (c << 6) | (static_cast<uint8_t>(text[i + k]) & 0x3F);
    out.push_back(c);
    i += n;
  }
  return out;
}

absl::StatusOr<Node> ParsePattern(std::u32string text) { return Parser(std::move(text)).Run(); }

}  // namespace flotilla::grammar::regex_syntax
