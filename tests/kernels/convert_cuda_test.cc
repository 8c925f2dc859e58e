#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/convert.h"
#include "kernels/cuda/convert.h"
#include "kernels/cuda/device.h"
#include "tests/kernels/cuda_test_util.h"

namespace flotilla::kernels {
namespace {

using ConvertCudaTest = CudaTest;  // skips without a GPU

TEST_F(ConvertCudaTest, MatchesCpuReferenceBitForBit) {
  const size_t n = (1 << 20) + 37;  // not a multiple of the block size
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.f, 10.f);
  std::vector<float> in(n);
  for (auto& v : in) v = dist(rng);

  std::vector<uint16_t> want_bf(n);
  std::vector<float> want_f(n);
  cpu::F32ToBf16(in.data(), want_bf.data(), n);
  cpu::Bf16ToF32(want_bf.data(), want_f.data(), n);

  float *d_in = nullptr, *d_out = nullptr;
  uint16_t* d_bf = nullptr;
  ASSERT_EQ(cudaMalloc(&d_in, n * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d_out, n * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d_bf, n * sizeof(uint16_t)), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d_in, in.data(), n * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cuda::LaunchF32ToBf16(d_in, d_bf, n, nullptr), cudaSuccess);
  ASSERT_EQ(cuda::LaunchBf16ToF32(d_bf, d_out, n, nullptr), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  std::vector<uint16_t> got_bf(n);
  std::vector<float> got_f(n);
  ASSERT_EQ(cudaMemcpy(got_bf.data(), d_bf, n * sizeof(uint16_t), cudaMemcpyDeviceToHost),
            cudaSuccess);
  ASSERT_EQ(cudaMemcpy(got_f.data(), d_out, n * sizeof(float), cudaMemcpyDeviceToHost),
            cudaSuccess);
  EXPECT_EQ(std::memcmp(got_bf.data(), want_bf.data(), n * sizeof(uint16_t)), 0);
  EXPECT_EQ(std::memcmp(got_f.data(), want_f.data(), n * sizeof(float)), 0);
  cudaFree(d_in);
  cudaFree(d_out);
  cudaFree(d_bf);
}

TEST_F(ConvertCudaTest, EmptyInputIsANoOp) {
  EXPECT_EQ(cuda::LaunchBf16ToF32(nullptr, nullptr, 0, nullptr), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

}  // namespace
}  // namespace flotilla::kernels
