// Prompt-lookup drafting (n-gram speculation): the tokens that followed an
// earlier occurrence of the context's last n tokens (the latest followed by
// k tokens, else the earliest), for the longest n in [min_n, max_n] that
// occurs earlier. No weights: it pays off
// on output that repeats its prompt or itself (code edits, quoting, JSON
// keys, summaries).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/types/span.h"

namespace flotilla::worker {

// Up to `k` tokens to follow `context` (the request's prompt and output so
// far); empty when no n-gram of length in [min_n, max_n] ending the context
// occurs earlier in it. 1 <= min_n <= max_n.
std::vector<int32_t> ProposeNgramDraft(absl::Span<const int32_t> context, int min_n, int max_n,
                                       int k);

}  // namespace flotilla::worker
