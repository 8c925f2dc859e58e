#include "worker/engine/device_arena.h"

#include "absl/strings/str_cat.h"

namespace flotilla {

absl::Status DeviceArena::AllocDevice(void** raw, size_t bytes) {
  const cudaError_t err = cudaMalloc(raw, bytes);
  if (err != cudaSuccess) {
    return absl::ResourceExhaustedError(absl::StrCat("cuda: cannot allocate ", bytes,
                                                     " bytes on device ", device_, ": ",
                                                     cudaGetErrorString(err)));
  }
  device_allocations_.push_back(*raw);
  allocated_bytes_ += bytes;
  return absl::OkStatus();
}

absl::Status DeviceArena::AllocPinned(void** raw, size_t bytes) {
  const cudaError_t err = cudaMallocHost(raw, bytes);
  if (err != cudaSuccess) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cuda: cannot allocate ", bytes,
                     " bytes of pinned host memory: ", cudaGetErrorString(err)));
  }
  host_allocations_.push_back(*raw);
  return absl::OkStatus();
}

void DeviceArena::Release() {
  if (device_allocations_.empty() && host_allocations_.empty()) return;
  if (device_ >= 0) cudaSetDevice(device_);
  for (void* p : device_allocations_) cudaFree(p);
  for (void* p : host_allocations_) cudaFreeHost(p);
  device_allocations_.clear();
  host_allocations_.clear();
  allocated_bytes_ = 0;
}

}  // namespace flotilla
