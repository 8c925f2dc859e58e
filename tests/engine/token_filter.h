// A TokenFilter for tests: a fixed set of allowed tokens, recording what it
// was told was drawn.
#pragma once

#include <cstdint>
#include <vector>

#include "worker/engine/sampler.h"

namespace flotilla::testing_filter {

class FixedFilter : public TokenFilter {
 public:
  FixedFilter(int vocab_size, const std::vector<int32_t>& allowed, std::vector<int32_t>* seen)
      : bits_((vocab_size + 31) / 32, 0u), seen_(seen) {
    for (int32_t t : allowed) bits_[t >> 5] |= 1u << (t & 31);
  }
  const uint32_t* Allowed() override { return bits_.data(); }
  void Accept(int32_t token) override { seen_->push_back(token); }

 private:
  std::vector<uint32_t> bits_;
  std::vector<int32_t>* seen_;
};

}  // namespace flotilla::testing_filter
