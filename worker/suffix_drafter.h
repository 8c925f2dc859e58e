// Suffix decoding (--speculative-method suffix): drafts the continuation
// best supported by earlier text that ends like the request's context does.
// Two indexes are searched: the request's own prompt and output, and a
// bounded one over the outputs this worker finished recently (agentic and
// repetitive workloads repeat earlier answers). Among the earlier places
// whose preceding tokens match the context's end for the longest length
// (up to kMaxSuffixMatch), the draft follows, token by token, the
// continuation most of them share (ties: the latest), the way a suffix tree
// walk by frequency does. No weights: it pays off on output that repeats its
// prompt, itself or recent answers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <unordered_map>
#include <vector>

#include "absl/types/span.h"

namespace flotilla::worker {

// Longest context suffix matched.
inline constexpr int kMaxSuffixMatch = 32;

// Token sequences ("documents") indexed by the pairs of tokens they hold, so
// the places ending like a context are found without a scan. Bounded: past
// `max_tokens` tokens the oldest documents are forgotten; each token pair
// keeps its latest `max_places` places.
class SuffixIndex {
 public:
  explicit SuffixIndex(int64_t max_tokens = int64_t{1} << 20, int max_places = 64)
      : max_tokens_(max_tokens), max_places_(max_places) {}

  // A new document (an output just finished).
  void Add(absl::Span<const int32_t> tokens);
  // Appends to the last document (the request's own context as it grows;
  // starts one when there is none).
  void Extend(absl::Span<const int32_t> tokens);

  // A place some document's text occupies: document `doc`, the position
  // after the matched pair.
  struct Place {
    int64_t doc = 0;  // a serial number (documents forgotten keep theirs)
    int64_t end = 0;
  };
  // The places (latest last) after which `a b` occurs.
  const std::vector<Place>* PlacesAfter(int32_t a, int32_t b) const;
  // The document's tokens; null once it was forgotten.
  const std::vector<int32_t>* Document(int64_t doc) const;

  int64_t tokens() const { return tokens_; }

 private:
  void IndexFrom(int64_t doc, size_t from);
  // Forgets the oldest documents past max_tokens_ and rebuilds the index.
  void Trim();

  int64_t max_tokens_;
  int max_places_;
  int64_t tokens_ = 0;
  int64_t first_doc_ = 0;  // the serial number of docs_.front()
  std::deque<std::vector<int32_t>> docs_;
  std::unordered_map<uint64_t, std::vector<Place>> places_;
};

// Up to `k` tokens to follow `context` (the request's prompt and output so
// far) from the places in `indexes` (null entries skipped) that end like it
// for the longest match of at least 2 tokens; empty when none does.
std::vector<int32_t> ProposeSuffixDraft(absl::Span<const SuffixIndex* const> indexes,
                                        absl::Span<const int32_t> context, int k);

}  // namespace flotilla::worker
