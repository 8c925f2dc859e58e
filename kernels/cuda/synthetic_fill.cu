#include "kernels/cuda/synthetic_fill.h"

namespace flotilla::kernels::cuda {
namespace {

constexpr int kThreads = 256;

unsigned GridFor(uint64_t work) {
  const uint64_t blocks = (work + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 65536 ? (blocks == 0 ? 1 : blocks) : 65536);
}

template <typename T>
__global__ void SyntheticNormalKernel(T* out, SyntheticFill fill, uint64_t state0, uint64_t first,
                                      uint64_t count) {
  for (uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    const float v = SyntheticNormalElement(fill, state0, first + i);
    if constexpr (sizeof(T) == 2) {
      out[i] = FloatToBf16(v);
    } else {
      out[i] = v;
    }
  }
}

// One thread per draw: its 8 bytes (those inside the range).
__global__ void SyntheticBytesKernel(uint8_t* out, uint64_t state0, uint64_t first,
                                     uint64_t count) {
  const uint64_t first_draw = first / 8, draws = (first + count + 7) / 8 - first_draw;
  for (uint64_t d = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; d < draws;
       d += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    const uint64_t r = SyntheticDraw(state0, first_draw + d);
    for (int b = 0; b < 8; ++b) {
      const uint64_t element = 8 * (first_draw + d) + b;
      if (element >= first && element < first + count) {
        out[element - first] = static_cast<uint8_t>(r >> (8 * b));
      }
    }
  }
}

__global__ void SyntheticScalesKernel(uint8_t* out, SyntheticFill fill, uint64_t state0,
                                      uint64_t first, uint64_t count) {
  for (uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    out[i] = SyntheticByte(fill, state0, first + i);
  }
}

}  // namespace

cudaError_t LaunchSyntheticFill(void* out, const SyntheticFill& fill, uint64_t state0,
                                int element_bytes, uint64_t first, uint64_t count,
                                cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  if (out == nullptr) return cudaErrorInvalidValue;
  const bool normal = fill.kind == SyntheticFillKind::kNormal;
  if (normal && element_bytes == 2) {
    SyntheticNormalKernel<<<GridFor(count), kThreads, 0, stream>>>(static_cast<uint16_t*>(out),
                                                                   fill, state0, first, count);
  } else if (normal && element_bytes == 4) {
    SyntheticNormalKernel<<<GridFor(count), kThreads, 0, stream>>>(static_cast<float*>(out), fill,
                                                                   state0, first, count);
  } else if (fill.kind == SyntheticFillKind::kBytes && element_bytes == 1) {
    SyntheticBytesKernel<<<GridFor(count / 8 + 2), kThreads, 0, stream>>>(
        static_cast<uint8_t*>(out), state0, first, count);
  } else if (fill.kind == SyntheticFillKind::kScales && element_bytes == 1) {
    SyntheticScalesKernel<<<GridFor(count), kThreads, 0, stream>>>(static_cast<uint8_t*>(out), fill,
                                                                   state0, first, count);
  } else {
    return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace flotilla::kernels::cuda
