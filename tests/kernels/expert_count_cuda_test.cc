// The device expert-load counters against their CPU reference.
#include <gtest/gtest.h>

#include <random>

#include "kernels/cpu/expert_count.h"
#include "kernels/cuda/expert_count.h"
#include "tests/kernels/cuda_test_util.h"

namespace flotilla::kernels {
namespace {

class ExpertCountCuda : public CudaTest {};

TEST_F(ExpertCountCuda, CountsLikeTheReferenceAndSkipsPadding) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> id(-1, 9);  // -1 padding, 8 and 9 out of bounds
  std::vector<int32_t> ids(100000);
  for (int32_t& v : ids) v = id(rng);
  constexpr int32_t kBound = 8;
  std::vector<uint32_t> want(kBound, 3);  // counters add to what they hold
  cpu::CountExpertRows(ids.data(), static_cast<int64_t>(ids.size()), kBound, want.data());

  Dev<int32_t> d_ids(ids);
  Dev<uint32_t> d_counts(std::vector<uint32_t>(kBound, 3));
  ASSERT_EQ(cuda::LaunchCountExpertRows(d_ids.p, static_cast<int64_t>(ids.size()), kBound,
                                        d_counts.p, nullptr),
            cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(d_counts.Get(), want);
  EXPECT_EQ(cuda::LaunchCountExpertRows(nullptr, 4, kBound, d_counts.p, nullptr),
            cudaErrorInvalidValue);
}

}  // namespace
}  // namespace flotilla::kernels
