// Helpers shared by the CUDA kernel tests: a device buffer owned by a test,
// the model shapes they run at and a fixture that skips when no GPU is present.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

#include "kernels/cuda/device.h"

namespace flotilla::kernels {

// `n` elements of T on the device, zeroed (or copied from a host vector);
// freed with the object.
template <typename T>
struct Dev {
  T* p = nullptr;
  size_t n = 0;
  explicit Dev(size_t count) : n(count) {
    EXPECT_EQ(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)), cudaSuccess);
    EXPECT_EQ(cudaMemset(p, 0, std::max<size_t>(n, 1) * sizeof(T)), cudaSuccess);
  }
  explicit Dev(const std::vector<T>& h) : Dev(h.size()) { Put(h); }
  ~Dev() { cudaFree(p); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  void Put(const std::vector<T>& h) {
    ASSERT_EQ(h.size(), n);
    ASSERT_EQ(cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  std::vector<T> Get() const {
    std::vector<T> h(n);
    EXPECT_EQ(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }
};

// gpt-oss's shapes (both sizes have them), which the kernel tests run at:
// 64 query heads and 8 KV heads of 64 values, scores scaled by 1/sqrt(64),
// and a hidden size of 2880.
inline constexpr int kQHeads = 64;
inline constexpr int kKvHeads = 8;
inline constexpr int kHeadDim = 64;
inline constexpr float kAttentionScale = 0.125f;
inline constexpr int kHidden = 2880;

// One bf16 ulp at the magnitude of r.
inline float Bf16Ulp(float r) {
  const float a = std::fabs(r);
  if (a < 1e-30f) return 1e-30f;
  int e;
  std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  return std::ldexp(1.0f, e - 8);
}

// Tests that need a GPU derive from this: they skip where none is present.
class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device present";
  }
};

}  // namespace flotilla::kernels
