#include "common/grammar/regex.h"

#include <algorithm>
#include <map>
#include <memory>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/grammar/regex_syntax.h"

namespace flotilla::grammar {
namespace {

using regex_syntax::AnyString;
using regex_syntax::ClassNode;
using regex_syntax::Complement;
using regex_syntax::LineTerminators;
using regex_syntax::Node;
using regex_syntax::Normalize;
using regex_syntax::Ranges;
using regex_syntax::RepeatNode;

constexpr size_t kMaxNfaStates = 200000;
// Work (NFA states visited) one determinization may do, and lookaheads per
// sequence: a pattern past them is refused rather than compiled slowly.
constexpr int64_t kMaxDeterminizeWork = 50'000'000;
constexpr int kMaxLookaheads = 8;



// --- UTF-8: code point ranges -> byte range sequences --------------------

int EncodedLength(char32_t c) { return c < 0x80 ? 1 : c < 0x800 ? 2 : c < 0x10000 ? 3 : 4; }

void Encode(char32_t c, uint8_t* out) {
  const int n = EncodedLength(c);
  if (n == 1) {
    out[0] = static_cast<uint8_t>(c);
    return;
  }
  static const uint8_t kLead[] = {0, 0, 0xC0, 0xE0, 0xF0};
  for (int i = n - 1; i > 0; --i) out[i] = 0x80 | (c & 0x3F), c >>= 6;
  out[0] = kLead[n] | static_cast<uint8_t>(c);
}

using ByteRanges = std::vector<std::pair<uint8_t, uint8_t>>;

// [lo, hi] of one encoded length, split until each piece is a product of
// byte ranges: a piece's ends either share the bits above each continuation
// byte or span them whole.
void SplitUtf8(char32_t lo, char32_t hi, std::vector<ByteRanges>* out) {
  const int n = EncodedLength(lo);
  for (int i = 1; i < n; ++i) {
    const char32_t low_bits = (char32_t{1} << (6 * i)) - 1;
    if ((lo & ~low_bits) == (hi & ~low_bits)) continue;
    if ((lo & low_bits) != 0) {
      SplitUtf8(lo, lo | low_bits, out);
      SplitUtf8((lo | low_bits) + 1, hi, out);
      return;
    }
    if ((hi & low_bits) != low_bits) {
      SplitUtf8(lo, (hi & ~low_bits) - 1, out);
      SplitUtf8(hi & ~low_bits, hi, out);
      return;
    }
  }
  uint8_t a[4], b[4];
  Encode(lo, a);
  Encode(hi, b);
  ByteRanges seq;
  for (int i = 0; i < n; ++i) seq.emplace_back(a[i], b[i]);
  out->push_back(std::move(seq));
}

std::vector<ByteRanges> Utf8Sequences(const Ranges& ranges) {
  std::vector<ByteRanges> out;
  for (auto [lo, hi] : ranges) {
    for (char32_t edge : {char32_t{0x7F}, char32_t{0x7FF}, char32_t{0xFFFF}}) {
      if (lo <= edge && hi > edge) {
        SplitUtf8(lo, edge, &out);
        lo = edge + 1;
      }
    }
    SplitUtf8(lo, hi, &out);
  }
  return out;
}

// --- Automata: a Thompson NFA over bytes, determinized --------------------

class Nfa {
 public:
  struct Fragment {
    int32_t in, out;
  };

  int32_t Add() {
    edges_.emplace_back();
    eps_.emplace_back();
    return static_cast<int32_t>(edges_.size()) - 1;
  }
  bool too_large() const { return edges_.size() > kMaxNfaStates; }

  absl::StatusOr<Fragment> Build(const Node& n) {
    if (too_large()) return absl::InvalidArgumentError("pattern too large to compile");
    switch (n.kind) {
      case Node::kEmpty: {
        const int32_t s = Add();
        return Fragment{s, s};
      }
      case Node::kClass: return Class(n.ranges);
      case Node::kConcat: return Concat(n.children, 0, n.children.size());
      case Node::kAlt: {
        const Fragment f{Add(), Add()};
        for (const Node& c : n.children) {
          absl::StatusOr<Fragment> sub = Build(c);
          if (!sub.ok()) return sub;
          eps_[f.in].push_back(sub->in);
          eps_[sub->out].push_back(f.out);
        }
        return f;
      }
      case Node::kRepeat: return Repeat(n);
      case Node::kBegin:
      case Node::kEnd:
        return absl::InvalidArgumentError(
            "'^' or '$' inside a group or mid-sequence is unsupported");
      case Node::kLookahead:
        return absl::InvalidArgumentError(
            "a lookahead inside a group or quantifier is unsupported");
    }
    return absl::InternalError("unknown pattern node");
  }

  absl::StatusOr<Fragment> Concat(const std::vector<Node>& items, size_t begin, size_t end) {
    const int32_t in = Add();
    int32_t at = in;
    for (size_t i = begin; i < end; ++i) {
      absl::StatusOr<Fragment> sub = Build(items[i]);
      if (!sub.ok()) return sub;
      eps_[at].push_back(sub->in);
      at = sub->out;
    }
    return Fragment{in, at};
  }

  // A deterministic automaton as a fragment (its accepting states lead out).
  Fragment Embed(const ByteDfa& dfa) {
    const Fragment f{Add(), Add()};
    if (dfa.empty()) return f;
    std::vector<int32_t> ids(dfa.size());
    for (int32_t s = 0; s < dfa.size(); ++s) ids[s] = Add();
    eps_[f.in].push_back(ids[0]);
    for (int32_t s = 0; s < dfa.size(); ++s) {
      if (dfa.Accepting(s)) eps_[ids[s]].push_back(f.out);
      for (int b = 0; b < 256;) {  // runs of bytes with one target are one edge
        const int32_t to = dfa.Next(s, static_cast<uint8_t>(b));
        int e = b;
        while (e + 1 < 256 && dfa.Next(s, static_cast<uint8_t>(e + 1)) == to) ++e;
        if (to >= 0) edges_[ids[s]].push_back({static_cast<uint8_t>(b), static_cast<uint8_t>(e), ids[to]});
        b = e + 1;
      }
    }
    return f;
  }

  void Link(int32_t from, int32_t to) { eps_[from].push_back(to); }

  // Subset construction over the byte classes the edges tell apart.
  absl::StatusOr<ByteDfa> Determinize(Fragment f, int max_states) const {
    std::set<int> cuts = {0, 256};
    for (const auto& list : edges_) {
      for (const Edge& e : list) cuts.insert(e.lo), cuts.insert(e.hi + 1);
    }
    const std::vector<int> bounds(cuts.begin(), cuts.end());
    ByteDfa dfa;
    std::map<std::vector<int32_t>, int32_t> ids;
    std::vector<std::vector<int32_t>> sets;
    auto id_of = [&](std::vector<int32_t> set) -> int32_t {
      Closure(&set);
      auto [it, added] = ids.emplace(set, dfa.size());
      if (added) {
        dfa.AddState(std::binary_search(set.begin(), set.end(), f.out));
        sets.push_back(std::move(set));
      }
      return it->second;
    };
    id_of({f.in});
    int64_t work = 0;
    for (size_t s = 0; s < sets.size(); ++s) {
      work += static_cast<int64_t>(sets[s].size()) * static_cast<int64_t>(bounds.size());
      if (work > kMaxDeterminizeWork) {
        return absl::InvalidArgumentError("pattern too complex to compile into an automaton");
      }
      for (size_t k = 0; k + 1 < bounds.size(); ++k) {
        const int lo = bounds[k], hi = bounds[k + 1] - 1;
        std::vector<int32_t> moved;
        for (int32_t state : sets[s]) {
          for (const Edge& e : edges_[state]) {
            if (e.lo <= lo && lo <= e.hi) moved.push_back(e.to);
          }
        }
        if (moved.empty()) continue;
        const int32_t to = id_of(std::move(moved));
        if (dfa.size() > max_states) {
          return absl::InvalidArgumentError(
              absl::StrCat("pattern needs more than ", max_states, " automaton states"));
        }
        for (int b = lo; b <= hi; ++b) dfa.SetNext(static_cast<int32_t>(s), static_cast<uint8_t>(b), to);
      }
    }
    dfa.Prune(0);
    return dfa;
  }

 private:
  struct Edge {
    uint8_t lo, hi;
    int32_t to;
  };

  Fragment Class(const Ranges& ranges) {
    const Fragment f{Add(), Add()};
    for (const ByteRanges& seq : Utf8Sequences(ranges)) {
      int32_t at = f.in;
      for (size_t i = 0; i < seq.size(); ++i) {
        const int32_t to = i + 1 == seq.size() ? f.out : Add();
        edges_[at].push_back({seq[i].first, seq[i].second, to});
        at = to;
      }
    }
    return f;
  }

  absl::StatusOr<Fragment> Repeat(const Node& n) {
    const Node& child = n.children[0];
    const int32_t in = Add();
    int32_t at = in;
    for (int i = 0; i < n.min; ++i) {
      absl::StatusOr<Fragment> sub = Build(child);
      if (!sub.ok()) return sub;
      eps_[at].push_back(sub->in);
      at = sub->out;
    }
    if (n.max < 0) {  // a loop: the child again and again, or nothing
      absl::StatusOr<Fragment> sub = Build(child);
      if (!sub.ok()) return sub;
      const int32_t out = Add();
      eps_[at].push_back(sub->in);
      eps_[at].push_back(out);
      eps_[sub->out].push_back(at);
      return Fragment{in, out};
    }
    const int32_t out = Add();
    for (int i = n.min; i < n.max; ++i) {  // each optional copy may be the last
      eps_[at].push_back(out);
      absl::StatusOr<Fragment> sub = Build(child);
      if (!sub.ok()) return sub;
      eps_[at].push_back(sub->in);
      at = sub->out;
    }
    eps_[at].push_back(out);
    return Fragment{in, out};
  }

  void Closure(std::vector<int32_t>* set) const {
    if (seen_.size() != edges_.size()) seen_.assign(edges_.size(), 0);
    ++stamp_;
    std::vector<int32_t> stack = *set;
    set->clear();
    while (!stack.empty()) {
      const int32_t s = stack.back();
      stack.pop_back();
      if (seen_[s] == stamp_) continue;
      seen_[s] = stamp_;
      set->push_back(s);
      for (int32_t t : eps_[s]) stack.push_back(t);
    }
    std::sort(set->begin(), set->end());
  }

  std::vector<std::vector<Edge>> edges_;
  std::vector<std::vector<int32_t>> eps_;
  // Closure's marks: a state is seen in this closure when it holds stamp_.
  mutable std::vector<uint32_t> seen_;
  mutable uint32_t stamp_ = 0;
};

// --- The top level: anchors, lookaheads, length bounds --------------------

bool HasAssertion(const Node& n) {
  if (n.kind == Node::kBegin || n.kind == Node::kEnd || n.kind == Node::kLookahead) return true;
  for (const Node& c : n.children) {
    if (HasAssertion(c)) return true;
  }
  return false;
}

std::vector<Node> Items(const Node& n) {
  if (n.kind == Node::kConcat) return n.children;
  return {n};
}

class PatternCompiler {
 public:
  explicit PatternCompiler(int max_states) : max_states_(max_states) {}

  absl::StatusOr<PatternLanguage> Run(const Node& root) {
    std::vector<Node> alternatives =
        root.kind == Node::kAlt ? root.children : std::vector<Node>{root};
    PatternLanguage out;
    std::vector<ByteDfa> parts;
    for (const Node& alternative : alternatives) {
      std::vector<Node> items = Items(alternative);
      const bool begins = !items.empty() && items.front().kind == Node::kBegin;
      if (begins) items.erase(items.begin());
      const bool ends = !items.empty() && items.back().kind == Node::kEnd;
      if (ends) items.pop_back();
      if (!begins) items.insert(items.begin(), AnyString());
      if (!ends) items.push_back(AnyString());
      if (alternatives.size() == 1 && begins && !items.empty()) {
        if (absl::Status st = FoldLengthLookahead(&items, &out); !st.ok()) return st;
      }
      absl::StatusOr<ByteDfa> dfa = Sequence(items);
      if (!dfa.ok()) return dfa.status();
      parts.push_back(*std::move(dfa));
    }
    Nfa nfa;
    const Nfa::Fragment all{nfa.Add(), nfa.Add()};
    for (const ByteDfa& part : parts) {
      const Nfa::Fragment f = nfa.Embed(part);
      nfa.Link(all.in, f.in);
      nfa.Link(f.out, all.out);
    }
    absl::StatusOr<ByteDfa> dfa = nfa.Determinize(all, max_states_);
    if (!dfa.ok()) return dfa.status();
    out.dfa = *std::move(dfa);
    if (out.max_length >= 0) {  // the length lookahead's '.' excludes line breaks
      Nfa lines;
      absl::StatusOr<Nfa::Fragment> f =
          lines.Build(RepeatNode(ClassNode(Complement(LineTerminators())), 0, -1));
      if (!f.ok()) return f.status();
      absl::StatusOr<ByteDfa> no_breaks = lines.Determinize(*f, max_states_);
      if (!no_breaks.ok()) return no_breaks.status();
      absl::StatusOr<ByteDfa> both = Intersect(out.dfa, *no_breaks, false, max_states_);
      if (!both.ok()) return absl::InvalidArgumentError(both.status().message());
      out.dfa = *std::move(both);
    }
    return out;
  }

 private:
  // A leading (?=.{m,n}$) (optionally (?=.{m,n}X?$), narrowed to
  // .{m,n}) only bounds the length: it becomes min/max length, tracked
  // beside the automaton rather than multiplied into it.
  absl::Status FoldLengthLookahead(std::vector<Node>* items, PatternLanguage* out) {
    const Node& look = items->front();
    if (look.kind != Node::kLookahead || look.negative) return absl::OkStatus();
    const std::vector<Node> body = Items(look.children[0]);
    if (body.size() < 2 || body.back().kind != Node::kEnd) return absl::OkStatus();
    const Node& dots = body.front();
    if (dots.kind != Node::kRepeat || dots.max < 0 || dots.children[0].kind != Node::kClass ||
        dots.children[0].ranges != Normalize(Complement(LineTerminators()))) {
      return absl::OkStatus();
    }
    for (size_t i = 1; i + 1 < body.size(); ++i) {
      if (body[i].kind != Node::kRepeat || body[i].min != 0 || HasAssertion(body[i])) {
        return absl::OkStatus();
      }
    }
    out->min_length = dots.min;
    out->max_length = dots.max;
    items->erase(items->begin());
    return absl::OkStatus();
  }

  // items, where a lookahead constrains everything after it: the rest's
  // automaton intersected with (or less) the lookahead's language.
  absl::StatusOr<ByteDfa> Sequence(const std::vector<Node>& items, int depth = 0) {
    if (depth > kMaxLookaheads) {
      return absl::InvalidArgumentError(
          absl::StrCat("more than ", kMaxLookaheads, " lookaheads in one sequence"));
    }
    size_t look = 0;
    while (look < items.size() && items[look].kind != Node::kLookahead) ++look;
    Nfa nfa;
    absl::StatusOr<Nfa::Fragment> head = nfa.Concat(items, 0, look);
    if (!head.ok()) return head.status();
    if (look == items.size()) return nfa.Determinize(*head, max_states_);
    const std::vector<Node> rest(items.begin() + look + 1, items.end());
    absl::StatusOr<ByteDfa> rest_dfa = Sequence(rest, depth + 1);
    if (!rest_dfa.ok()) return rest_dfa;
    absl::StatusOr<ByteDfa> look_dfa = Lookahead(items[look]);
    if (!look_dfa.ok()) return look_dfa;
    absl::StatusOr<ByteDfa> tail =
        Intersect(*rest_dfa, *look_dfa, items[look].negative, max_states_);
    if (!tail.ok()) return absl::InvalidArgumentError(tail.status().message());
    const Nfa::Fragment embedded = nfa.Embed(*tail);
    nfa.Link(head->out, embedded.in);
    return nfa.Determinize({head->in, embedded.out}, max_states_);
  }

  // The strings a lookahead's body starts (or, ending in '$', is).
  absl::StatusOr<ByteDfa> Lookahead(const Node& look) {
    std::vector<Node> body = Items(look.children[0]);
    if (!body.empty() && body.back().kind == Node::kEnd) {
      body.pop_back();
    } else {
      body.push_back(AnyString());
    }
    for (const Node& n : body) {
      if (HasAssertion(n)) {
        return absl::InvalidArgumentError("an assertion inside a lookahead is unsupported");
      }
    }
    Nfa nfa;
    absl::StatusOr<Nfa::Fragment> f = nfa.Concat(body, 0, body.size());
    if (!f.ok()) return f.status();
    return nfa.Determinize(*f, max_states_);
  }

  int max_states_;
};

}  // namespace

absl::StatusOr<PatternLanguage> CompilePattern(std::string_view pattern, int max_states) {
  absl::StatusOr<std::u32string> text = regex_syntax::DecodeUtf8(pattern);
  if (!text.ok()) return text.status();
  if (text->size() > static_cast<size_t>(kMaxPatternLength)) {
    return absl::InvalidArgumentError(
        absl::StrCat("longer than ", kMaxPatternLength, " characters"));
  }
  absl::StatusOr<Node> root = regex_syntax::ParsePattern(*std::move(text));
  if (!root.ok()) return root.status();
  absl::StatusOr<PatternLanguage> language = PatternCompiler(max_states).Run(*root);
  if (!language.ok()) return language;
  RestrictToJsonText(&language->dfa);
  return language;
}

}  // namespace flotilla::grammar
