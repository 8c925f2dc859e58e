#include "common/grammar/byte_dfa.h"

#include <algorithm>
#include <deque>
#include <map>
#include <set>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"

namespace flotilla::grammar {

int32_t ByteDfa::AddState(bool accepting) {
  accepting_.push_back(accepting ? 1 : 0);
  next_.resize(next_.size() + 256, kDead);
  return size() - 1;
}

void ByteDfa::Prune(int32_t start) {
  const int n = size();
  std::vector<std::vector<int32_t>> preds(n);
  for (int32_t s = 0; s < n; ++s) {
    for (int b = 0; b < 256; ++b) {
      if (Next(s, b) >= 0) preds[Next(s, b)].push_back(s);
    }
  }
  std::vector<uint8_t> live(n, 0);  // can reach an accepting state
  std::deque<int32_t> queue;
  for (int32_t s = 0; s < n; ++s) {
    if (Accepting(s)) live[s] = 1, queue.push_back(s);
  }
  while (!queue.empty()) {
    const int32_t t = queue.front();
    queue.pop_front();
    for (int32_t s : preds[t]) {
      if (!live[s]) live[s] = 1, queue.push_back(s);
    }
  }
  ByteDfa out;
  if (start >= 0 && start < n && live[start]) {
    std::vector<int32_t> renamed(n, kDead);
    renamed[start] = out.AddState(Accepting(start));
    queue.push_back(start);
    while (!queue.empty()) {  // breadth first from the start: it becomes 0
      const int32_t s = queue.front();
      queue.pop_front();
      for (int b = 0; b < 256; ++b) {
        const int32_t t = Next(s, b);
        if (t < 0 || !live[t]) continue;
        if (renamed[t] < 0) renamed[t] = out.AddState(Accepting(t)), queue.push_back(t);
        out.SetNext(renamed[s], static_cast<uint8_t>(b), renamed[t]);
      }
    }
  }
  *this = std::move(out);
  if (!empty()) Minimize();
}

// Moore's partition refinement: states with the same acceptance and the same
// blocks after every byte are one.
void ByteDfa::Minimize() {
  const int n = size();
  std::vector<int32_t> block(n);
  for (int32_t s = 0; s < n; ++s) block[s] = Accepting(s) ? 1 : 0;
  int blocks = 0;
  for (;;) {
    std::map<std::vector<int32_t>, int32_t> ids;
    std::vector<int32_t> next_block(n);
    std::vector<int32_t> signature(257);
    for (int32_t s = 0; s < n; ++s) {
      signature[0] = block[s];
      for (int b = 0; b < 256; ++b) signature[b + 1] = Next(s, b) < 0 ? -1 : block[Next(s, b)];
      auto [it, added] = ids.emplace(signature, static_cast<int32_t>(ids.size()));
      next_block[s] = it->second;
    }
    block.swap(next_block);
    if (static_cast<int>(ids.size()) == blocks) break;
    blocks = static_cast<int>(ids.size());
  }
  if (blocks == n) return;
  // One state per block, the start's block first (states are numbered
  // breadth first, so a block's first state is met before its edges).
  ByteDfa out;
  std::vector<int32_t> renamed(blocks, kDead);
  std::vector<int32_t> representative;
  for (int32_t s = 0; s < n; ++s) {
    if (renamed[block[s]] >= 0) continue;
    renamed[block[s]] = out.AddState(Accepting(s));
    representative.push_back(s);
  }
  for (int32_t r = 0; r < out.size(); ++r) {
    for (int b = 0; b < 256; ++b) {
      const int32_t t = Next(representative[r], b);
      if (t >= 0) out.SetNext(r, static_cast<uint8_t>(b), renamed[block[t]]);
    }
  }
  *this = std::move(out);
}

absl::StatusOr<ByteDfa> Intersect(const ByteDfa& a, const ByteDfa& b, bool subtract,
                                  int max_states) {
  ByteDfa out;
  if (a.empty()) return out;
  if (b.empty() && !subtract) return out;
  // A pair's second state is -1 once `b` refused (only kept when subtracting).
  absl::flat_hash_map<std::pair<int32_t, int32_t>, int32_t> ids;
  std::deque<std::pair<int32_t, int32_t>> queue;
  auto id_of = [&](int32_t sa, int32_t sb) -> int32_t {
    auto [it, added] = ids.emplace(std::make_pair(sa, sb), out.size());
    if (added) {
      const bool in_b = sb >= 0 && b.Accepting(sb);
      out.AddState(a.Accepting(sa) && (subtract ? !in_b : in_b));
      queue.emplace_back(sa, sb);
    }
    return it->second;
  };
  id_of(0, b.empty() ? -1 : 0);
  while (!queue.empty()) {
    const auto [sa, sb] = queue.front();
    queue.pop_front();
    const int32_t from = ids[{sa, sb}];
    for (int byte = 0; byte < 256; ++byte) {
      const int32_t na = a.Next(sa, static_cast<uint8_t>(byte));
      const int32_t nb = sb < 0 ? -1 : b.Next(sb, static_cast<uint8_t>(byte));
      if (na < 0 || (nb < 0 && !subtract)) continue;
      const int32_t to = id_of(na, nb);
      if (out.size() > max_states) {
        return absl::ResourceExhaustedError(
            absl::StrCat("the combined automaton needs more than ", max_states, " states"));
      }
      out.SetNext(from, static_cast<uint8_t>(byte), to);
    }
  }
  out.Prune(0);
  return out;
}

void RestrictToJsonText(ByteDfa* dfa) {
  for (int32_t s = 0; s < dfa->size(); ++s) {
    for (int byte = 0; byte < 0x20; ++byte) {
      if (byte == '\b' || byte == '\t' || byte == '\n' || byte == '\f' || byte == '\r') continue;
      dfa->SetNext(s, static_cast<uint8_t>(byte), ByteDfa::kDead);
    }
    dfa->SetNext(s, 0x7F, ByteDfa::kDead);
  }
  dfa->Prune(0);
}

absl::StatusOr<LengthTable> LengthTable::Build(const ByteDfa& dfa, int64_t min_length,
                                               int64_t max_length, int64_t max_bits) {
  LengthTable t;
  t.min_ = min_length;
  t.max_ = max_length;
  if (min_length == 0 && max_length < 0) return t;  // no bound: every live state will do
  const bool saturate = max_length < 0;
  t.cap_ = saturate ? min_length : max_length;
  t.words_ = t.cap_ / 64 + 1;
  const int n = dfa.size();
  if (static_cast<int64_t>(n) * (t.cap_ + 1) > max_bits) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the length bound ", t.cap_, " with a ", n, "-state automaton is too large to track"));
  }
  t.bits_.assign(static_cast<size_t>(n) * t.words_, 0);
  // Edges into each state, once per (source, weight): a byte that starts a
  // code point adds one to the length, a continuation byte nothing.
  std::vector<std::vector<std::pair<int32_t, int>>> preds(n);
  for (int32_t s = 0; s < n; ++s) {
    std::set<std::pair<int32_t, int>> seen;
    for (int byte = 0; byte < 256; ++byte) {
      const int32_t to = dfa.Next(s, static_cast<uint8_t>(byte));
      const int weight = (byte & 0xC0) == 0x80 ? 0 : 1;
      if (to >= 0 && seen.emplace(to, weight).second) preds[to].emplace_back(s, weight);
    }
  }
  std::deque<int32_t> queue;
  std::vector<uint8_t> queued(n, 0);
  for (int32_t s = 0; s < n; ++s) {
    if (!dfa.Accepting(s)) continue;
    t.bits_[s * t.words_] |= 1;
    queue.push_back(s), queued[s] = 1;
  }
  std::vector<uint64_t> shifted(t.words_);
  const int64_t last_word = t.cap_ / 64;
  const uint64_t last_bit = 1ull << (t.cap_ % 64);
  // Each state's set only grows, but a worst case could still churn: past
  // this much work the bounds are refused rather than tracked slowly.
  int64_t work = 0;
  const int64_t max_work = 8 * max_bits;
  while (!queue.empty()) {
    const int32_t to = queue.front();
    queue.pop_front();
    queued[to] = 0;
    work += static_cast<int64_t>(preds[to].size()) * t.words_;
    if (work > max_work) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the length bound ", t.cap_, " is too costly to track beside this automaton"));
    }
    const uint64_t* from_bits = &t.bits_[to * t.words_];
    for (const auto& [source, weight] : preds[to]) {
      if (weight == 0) {
        std::copy(from_bits, from_bits + t.words_, shifted.begin());
      } else {  // lengths + 1; past the cap they are dropped or saturate at it
        uint64_t carry = 0;
        for (int64_t w = 0; w < t.words_; ++w) {
          shifted[w] = (from_bits[w] << 1) | carry;
          carry = from_bits[w] >> 63;
        }
        const bool at_cap = from_bits[last_word] & last_bit;
        shifted[last_word] &= last_bit | (last_bit - 1);
        if (saturate && at_cap) shifted[last_word] |= last_bit;
      }
      uint64_t* into = &t.bits_[source * t.words_];
      bool changed = false;
      for (int64_t w = 0; w < t.words_; ++w) {
        const uint64_t merged = into[w] | shifted[w];
        changed = changed || merged != into[w];
        into[w] = merged;
      }
      if (changed && !queued[source]) queue.push_back(source), queued[source] = 1;
    }
  }
  return t;
}

bool LengthTable::Feasible(int32_t state, int64_t count) const {
  if (words_ == 0) return true;
  const int64_t lo = std::min(std::max<int64_t>(0, min_ - count), cap_);
  const int64_t hi = std::min(max_ < 0 ? cap_ : max_ - count, cap_);
  if (hi < lo) return false;
  const uint64_t* bits = &bits_[state * words_];
  for (int64_t w = lo / 64; w <= hi / 64; ++w) {
    uint64_t word = bits[w];
    if (w == lo / 64) word &= ~0ull << (lo % 64);
    if (w == hi / 64 && hi % 64 != 63) word &= (1ull << (hi % 64 + 1)) - 1;
    if (word != 0) return true;
  }
  return false;
}

}  // namespace flotilla::grammar
