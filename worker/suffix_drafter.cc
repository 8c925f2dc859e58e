#include "worker/suffix_drafter.h"

#include <algorithm>
#include <map>

namespace flotilla::worker {
namespace {

uint64_t PairKey(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

// One earlier place a draft may follow: the text after it.
struct Candidate {
  const std::vector<int32_t>* text = nullptr;
  size_t next = 0;  // the position after the matched part
  int order = 0;    // later places rank higher on ties
};

// How many tokens before `end` in `text` equal the context's last ones (at
// most kMaxSuffixMatch; the pair itself counts).
int MatchLength(const std::vector<int32_t>& text, size_t end, absl::Span<const int32_t> context) {
  int n = 0;
  while (n < kMaxSuffixMatch && static_cast<size_t>(n) < end &&
         static_cast<size_t>(n) < context.size() &&
         text[end - 1 - n] == context[context.size() - 1 - n]) {
    ++n;
  }
  return n;
}

}  // namespace

void SuffixIndex::Add(absl::Span<const int32_t> tokens) {
  docs_.emplace_back(tokens.begin(), tokens.end());
  tokens_ += static_cast<int64_t>(tokens.size());
  IndexFrom(first_doc_ + static_cast<int64_t>(docs_.size()) - 1, 0);
  if (tokens_ > max_tokens_) Trim();
}

void SuffixIndex::Extend(absl::Span<const int32_t> tokens) {
  if (docs_.empty()) {
    Add(tokens);
    return;
  }
  std::vector<int32_t>& doc = docs_.back();
  const size_t from = doc.size();
  doc.insert(doc.end(), tokens.begin(), tokens.end());
  tokens_ += static_cast<int64_t>(tokens.size());
  IndexFrom(first_doc_ + static_cast<int64_t>(docs_.size()) - 1, from);
  if (tokens_ > max_tokens_) Trim();
}

void SuffixIndex::IndexFrom(int64_t doc, size_t from) {
  const std::vector<int32_t>& text = docs_[static_cast<size_t>(doc - first_doc_)];
  for (size_t end = std::max<size_t>(from, 1) + 1; end <= text.size(); ++end) {
    std::vector<Place>& places = places_[PairKey(text[end - 2], text[end - 1])];
    if (static_cast<int>(places.size()) == max_places_) places.erase(places.begin());
    places.push_back(Place{doc, static_cast<int64_t>(end)});
  }
}

void SuffixIndex::Trim() {
  // Down to three quarters, so the rebuild happens once per quarter of the
  // bound's new tokens. The last document always stays.
  while (tokens_ > max_tokens_ * 3 / 4 && docs_.size() > 1) {
    tokens_ -= static_cast<int64_t>(docs_.front().size());
    docs_.pop_front();
    ++first_doc_;
  }
  places_.clear();
  for (size_t d = 0; d < docs_.size(); ++d) IndexFrom(first_doc_ + static_cast<int64_t>(d), 0);
}

const std::vector<SuffixIndex::Place>* SuffixIndex::PlacesAfter(int32_t a, int32_t b) const {
  auto it = places_.find(PairKey(a, b));
  return it == places_.end() ? nullptr : &it->second;
}

const std::vector<int32_t>* SuffixIndex::Document(int64_t doc) const {
  if (doc < first_doc_ || doc >= first_doc_ + static_cast<int64_t>(docs_.size())) return nullptr;
  return &docs_[static_cast<size_t>(doc - first_doc_)];
}

std::vector<int32_t> ProposeSuffixDraft(absl::Span<const SuffixIndex* const> indexes,
                                        absl::Span<const int32_t> context, int k) {
  const size_t n = context.size();
  if (k <= 0 || n < 2) return {};
  // The places ending like the context for the longest length, with text
  // after them.
  std::vector<Candidate> best;
  int best_length = 0, order = 0;
  for (const SuffixIndex* index : indexes) {
    if (index == nullptr) continue;
    const std::vector<SuffixIndex::Place>* places =
        index->PlacesAfter(context[n - 2], context[n - 1]);
    if (places == nullptr) continue;
    for (const SuffixIndex::Place& p : *places) {
      ++order;
      const std::vector<int32_t>* text = index->Document(p.doc);
      const size_t end = static_cast<size_t>(p.end);
      if (text == nullptr || end >= text->size()) continue;  // nothing follows it
      const int length = MatchLength(*text, end, context);
      if (length < best_length) continue;
      if (length > best_length) best.clear();
      best_length = length;
      best.push_back(Candidate{text, end, order});
    }
  }
  // Follow the continuation most of them share, dropping those that leave it.
  std::vector<int32_t> draft;
  while (static_cast<int>(draft.size()) < k && !best.empty()) {
    std::map<int32_t, std::pair<int, int>> votes;  // token -> (count, latest order)
    for (const Candidate& c : best) {
      auto& v = votes[(*c.text)[c.next]];
      ++v.first;
      v.second = std::max(v.second, c.order);
    }
    auto chosen = std::max_element(votes.begin(), votes.end(), [](const auto& a, const auto& b) {
      return a.second < b.second;
    });
    const int32_t token = chosen->first;
    draft.push_back(token);
    std::vector<Candidate> kept;
    for (Candidate c : best) {
      if ((*c.text)[c.next] != token) continue;
      if (++c.next < c.text->size()) kept.push_back(c);
    }
    best = std::move(kept);
  }
  return draft;
}

}  // namespace flotilla::worker
