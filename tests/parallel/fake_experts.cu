#include "common/bf16.h"
#include "tests/parallel/fake_experts.h"

namespace flotilla::parallel::testing {
namespace {

__global__ void FakeExpertsKernel(const uint16_t* x, const int32_t* slot, const float* ones,
                                  int64_t rows, int hidden, const int32_t* expert_of_slot,
                                  int slots, float* out) {
  const int64_t n = rows * hidden;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / hidden;
    const int s = slot[r];
    if (s < 0 || s >= slots) continue;
    const int h = static_cast<int>(i % hidden);
    const float v = FakeExpert(Bf16ToFloat(x[i]), expert_of_slot[s], h);
    out[i] = SyntheticAdd(out[i], SyntheticMul(ones[r], v));
  }
}

}  // namespace

cudaError_t LaunchFakeExperts(const uint16_t* x, const int32_t* slot, const float* ones,
                              int64_t rows, int hidden, const int32_t* expert_of_slot, int slots,
                              float* out, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  FakeExpertsKernel<<<264, 256, 0, stream>>>(x, slot, ones, rows, hidden, expert_of_slot, slots,
                                             out);
  return cudaGetLastError();
}

}  // namespace flotilla::parallel::testing
