#include "common/grammar/vocabulary_index.h"

#include <algorithm>

namespace flotilla::grammar {

namespace {

// The characters of `bytes` when it is plain text (VocabularyIndex::
// AllowPlainText), else -1: the UTF-8 rules JsonMatcher applies to a string.
int PlainTextChars(const std::string& bytes) {
  int chars = 0;
  for (size_t i = 0; i < bytes.size();) {
    const uint8_t b = static_cast<uint8_t>(bytes[i]);
    int need = 0;
    uint8_t lo = 0x80, hi = 0xBF;
    if (b >= 0x20 && b < 0x7F) {
      if (b == '"' || b == '\\') return -1;
    } else if (b >= 0xC2 && b <= 0xDF) {
      need = 1;
    } else if (b >= 0xE0 && b <= 0xEF) {
      need = 2;
      if (b == 0xE0) lo = 0xA0;
      if (b == 0xED) hi = 0x9F;
    } else if (b >= 0xF0 && b <= 0xF4) {
      need = 3;
      if (b == 0xF0) lo = 0x90;
      if (b == 0xF4) hi = 0x8F;
    } else {
      return -1;  // a control byte, DEL, or no lead byte of UTF-8
    }
    ++i;
    for (; need > 0; --need, ++i) {
      if (i >= bytes.size()) return -1;  // the character ends in a later token
      const uint8_t c = static_cast<uint8_t>(bytes[i]);
      if (c < lo || c > hi) return -1;
      lo = 0x80;
      hi = 0xBF;
    }
    ++chars;
  }
  return chars;
}

}  // namespace

VocabularyIndex::VocabularyIndex(TokenVocabulary vocab) : vocab_(std::move(vocab)) {
  vocab_.bytes.resize(vocab_.vocab_size);
  std::vector<int32_t> ordinary, not_plain;
  std::vector<int> chars(vocab_.vocab_size, -1);
  int most_chars = 0;
  for (int32_t t = 0; t < vocab_.vocab_size; ++t) {
    if (vocab_.bytes[t].empty()) continue;
    ordinary.push_back(t);
    longest_ = std::max(longest_, static_cast<int>(vocab_.bytes[t].size()));
    chars[t] = PlainTextChars(vocab_.bytes[t]);
    if (chars[t] < 0) not_plain.push_back(t);
    most_chars = std::max(most_chars, chars[t]);
  }
  all_ = SortedOf(std::move(ordinary));
  not_plain_ = SortedOf(std::move(not_plain));
  plain_up_to_.assign(most_chars + 1, std::vector<uint32_t>(words(), 0u));
  for (int32_t t = 0; t < vocab_.vocab_size; ++t) {
    if (chars[t] >= 0) SetBit(plain_up_to_[chars[t]].data(), t);
  }
  for (int c = 1; c <= most_chars; ++c) {
    for (int w = 0; w < words(); ++w) plain_up_to_[c][w] |= plain_up_to_[c - 1][w];
  }
}

VocabularyIndex::Sorted VocabularyIndex::SortedOf(std::vector<int32_t> ids) const {
  Sorted s;
  s.order = std::move(ids);
  std::sort(s.order.begin(), s.order.end(),
            [&](int32_t a, int32_t b) { return vocab_.bytes[a] < vocab_.bytes[b]; });
  s.lcp.assign(s.order.size(), 0);
  for (size_t k = 1; k < s.order.size(); ++k) {
    const std::string& t = vocab_.bytes[s.order[k]];
    const std::string& p = vocab_.bytes[s.order[k - 1]];
    const size_t n = std::min(t.size(), p.size());
    size_t i = 0;
    while (i < n && t[i] == p[i]) ++i;
    s.lcp[k] = static_cast<int>(i);
  }
  s.next_first.assign(s.order.size(), static_cast<int>(s.order.size()));
  for (size_t k = s.order.size(); k-- > 1;) {
    s.next_first[k - 1] = s.lcp[k] > 0 ? s.next_first[k] : static_cast<int>(k);
  }
  return s;
}

void VocabularyIndex::AllowAllOrdinary(uint32_t* bits) const {
  for (int32_t t : all_.order) SetBit(bits, t);
}

void VocabularyIndex::AllowPlainText(int64_t max_chars, uint32_t* bits) const {
  if (max_chars == 0 || plain_up_to_.empty()) return;  // the empty token is not ordinary
  const int64_t most = static_cast<int64_t>(plain_up_to_.size()) - 1;
  const std::vector<uint32_t>& mask =
      plain_up_to_[max_chars < 0 || max_chars > most ? most : max_chars];
  for (int w = 0; w < words(); ++w) bits[w] |= mask[w];
}

}  // namespace flotilla::grammar
