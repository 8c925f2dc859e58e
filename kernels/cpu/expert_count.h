// Expert-load counting, CPU reference of kernels/cuda/expert_count.h:
// counts[ids[i]] += 1 for every i < n with 0 <= ids[i] < bound (ids outside,
// e.g. -1 padding rows, are skipped).
#pragma once

#include <cstdint>

namespace flotilla::kernels::cpu {

inline void CountExpertRows(const int32_t* ids, int64_t n, int32_t bound, uint32_t* counts) {
  for (int64_t i = 0; i < n; ++i) {
    if (ids[i] >= 0 && ids[i] < bound) ++counts[ids[i]];
  }
}

}  // namespace flotilla::kernels::cpu
