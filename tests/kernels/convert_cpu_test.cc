#include <gtest/gtest.h>

#include <vector>

#include "common/bf16.h"
#include "kernels/cpu/convert.h"

namespace flotilla::kernels::cpu {
namespace {

TEST(ConvertCpu, Bf16RoundTrip) {
  std::vector<float> in = {0.f, 1.f, -3.5f, 1e-3f, 1234.5f};
  std::vector<uint16_t> bf(in.size());
  std::vector<float> out(in.size());
  F32ToBf16(in.data(), bf.data(), in.size());
  Bf16ToF32(bf.data(), out.data(), in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    EXPECT_EQ(bf[i], FloatToBf16(in[i]));
    EXPECT_NEAR(out[i], in[i], std::abs(in[i]) / 128) << i;
  }
}

}  // namespace
}  // namespace flotilla::kernels::cpu
