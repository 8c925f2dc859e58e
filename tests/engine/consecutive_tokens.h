// Prompts for the KV cache and engine tests: runs of consecutive token ids, so
// prompts of different starts share no block and equal starts share all.
#pragma once

#include <cstdint>
#include <numeric>
#include <vector>

namespace flotilla::testing_util {

// The ids first, first + 1, ..., first + n - 1.
inline std::vector<int32_t> ConsecutiveTokens(int n, int first = 100) {
  std::vector<int32_t> t(n);
  std::iota(t.begin(), t.end(), first);
  return t;
}

}  // namespace flotilla::testing_util
