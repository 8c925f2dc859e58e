#include "common/grammar/vocabulary_index.h"

#include <algorithm>

namespace flotilla::grammar {

VocabularyIndex::VocabularyIndex(TokenVocabulary vocab) : vocab_(std::move(vocab)) {
  vocab_.bytes.resize(vocab_.vocab_size);
  for (int32_t t = 0; t < vocab_.vocab_size; ++t) {
    if (!vocab_.bytes[t].empty()) order_.push_back(t);
  }
  std::sort(order_.begin(), order_.end(),
            [&](int32_t a, int32_t b) { return vocab_.bytes[a] < vocab_.bytes[b]; });
  lcp_.assign(order_.size(), 0);
  for (size_t k = 0; k < order_.size(); ++k) {
    const std::string& t = vocab_.bytes[order_[k]];
    longest_ = std::max(longest_, static_cast<int>(t.size()));
    if (k == 0) continue;
    const std::string& p = vocab_.bytes[order_[k - 1]];
    const size_t n = std::min(t.size(), p.size());
    size_t i = 0;
    while (i < n && t[i] == p[i]) ++i;
    lcp_[k] = static_cast<int>(i);
  }
}

void VocabularyIndex::AllowAllOrdinary(uint32_t* bits) const {
  for (int32_t t : order_) SetBit(bits, t);
}

}  // namespace flotilla::grammar
