#include "kernels/cuda/device.h"

#include <cuda_runtime_api.h>

namespace flotilla::kernels::cuda {

int DeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return n;
}

bool GetDeviceProps(int ordinal, DeviceProps* props) {
  cudaDeviceProp p;
  if (ordinal < 0 || ordinal >= DeviceCount() ||
      cudaGetDeviceProperties(&p, ordinal) != cudaSuccess) {
    return false;
  }
  props->name = p.name;
  props->memory_bytes = p.totalGlobalMem;
  props->compute_capability = p.major * 10 + p.minor;
  props->multiprocessors = p.multiProcessorCount;
  return true;
}

}  // namespace flotilla::kernels::cuda
