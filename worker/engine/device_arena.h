// The memory a CudaEngine holds on its device and in pinned host memory:
// every buffer it allocates (weights, the KV arena, step buffers and
// workspaces, the pinned mirrors they are filled from) goes through one
// DeviceArena, which frees them all when it goes (or on Release) and counts
// the device bytes, memory the engine holds that the KV cache must leave.
// Not thread-safe: one owner.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <vector>

#include "absl/status/status.h"

namespace flotilla {

class DeviceArena {
 public:
  explicit DeviceArena(int device) : device_(device) {}
  ~DeviceArena() { Release(); }
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;

  // `count` elements of T on the device (at least 16 bytes);
  // RESOURCE_EXHAUSTED when the device has no room.
  template <typename T>
  absl::Status Alloc(T** p, size_t count) {
    void* raw = nullptr;
    if (absl::Status s = AllocDevice(&raw, std::max<size_t>(count * sizeof(T), 16)); !s.ok())
      return s;
    *p = static_cast<T*>(raw);
    return absl::OkStatus();
  }
  // `count` elements of T in pinned host memory (copies to and from the
  // device run asynchronously).
  template <typename T>
  absl::Status AllocHost(T** p, size_t count) {
    void* raw = nullptr;
    if (absl::Status s = AllocPinned(&raw, count * sizeof(T)); !s.ok()) return s;
    *p = static_cast<T*>(raw);
    return absl::OkStatus();
  }
  // Device memory allocated elsewhere that the engine holds (the MoE weights).
  void Count(size_t bytes) { allocated_bytes_ += bytes; }
  // Device bytes held: Alloc's and Count's.
  size_t allocated_bytes() const { return allocated_bytes_; }
  // Frees everything (the caller has made `device` current or not: this does).
  void Release();

 private:
  absl::Status AllocDevice(void** raw, size_t bytes);
  absl::Status AllocPinned(void** raw, size_t bytes);

  int device_ = 0;
  std::vector<void*> device_allocations_;
  std::vector<void*> host_allocations_;
  size_t allocated_bytes_ = 0;
};

}  // namespace flotilla
