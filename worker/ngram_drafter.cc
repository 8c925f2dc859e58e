#include "worker/ngram_drafter.h"

#include <algorithm>

namespace flotilla::worker {

std::vector<int32_t> ProposeNgramDraft(absl::Span<const int32_t> context, int min_n, int max_n,
                                       int k) {
  const int64_t size = static_cast<int64_t>(context.size());
  if (k <= 0) return {};
  for (int64_t n = std::min<int64_t>(max_n, size - 1); n >= min_n; --n) {
    const absl::Span<const int32_t> tail = context.subspan(size - n);
    // The latest earlier match followed by k tokens; failing that, the
    // earliest (followed by the most). In a run of one repeated phrase the
    // latest match is followed by less than a phrase.
    int64_t found = -1;
    for (int64_t start = size - n - 1; start >= 0; --start) {
      if (!std::equal(tail.begin(), tail.end(), context.begin() + start)) continue;
      found = start;
      if (size - (start + n) >= k) break;
    }
    if (found < 0) continue;
    const int64_t from = found + n;
    const int64_t to = std::min<int64_t>(size, from + k);
    return std::vector<int32_t>(context.begin() + from, context.begin() + to);
  }
  return {};
}

}  // namespace flotilla::worker
