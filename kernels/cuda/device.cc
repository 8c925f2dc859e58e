#include "kernels/cuda/device.h"

#include <cuda_runtime_api.h>

#include <cstdio>

namespace flotilla::kernels::cuda {
namespace {

std::string FormatUuid(const cudaUUID_t& uuid) {
  const auto* b = reinterpret_cast<const unsigned char*>(uuid.bytes);
  char text[48];
  std::snprintf(text, sizeof(text),
                "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
                b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
                b[14], b[15]);
  return text;
}

}  // namespace

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
  props->uuid = FormatUuid(p.uuid);
  return true;
}

bool GetDeviceMemory(int ordinal, uint64_t* free_bytes, uint64_t* total_bytes) {
  if (ordinal < 0 || ordinal >= DeviceCount()) return false;
  int previous = 0;
  if (cudaGetDevice(&previous) != cudaSuccess) previous = ordinal;
  size_t free_now = 0, total = 0;
  const bool ok =
      cudaSetDevice(ordinal) == cudaSuccess && cudaMemGetInfo(&free_now, &total) == cudaSuccess;
  if (!ok) cudaGetLastError();
  cudaSetDevice(previous);
  *free_bytes = free_now;
  *total_bytes = total;
  return ok;
}

}  // namespace flotilla::kernels::cuda
