// Host helper shared by the CUDA kernels' launchers. Included by .cu files only.
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <atomic>

namespace flotilla::kernels::cuda {

// A value per CUDA device, for what a launcher sets or learns once on a device
// (a kernel's raised shared-memory limit): a process driving several devices
// keeps one for each, and threads may read and set it at once.
template <typename T>
class PerDevice {
 public:
  // The current device's slot; nullptr when the device cannot be read or is
  // beyond the first 64 (callers then do the work every time).
  std::atomic<T>* Current() {
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kMaxDevices) {
      return nullptr;
    }
    return &slots_[device];
  }

 private:
  static constexpr int kMaxDevices = 64;
  std::array<std::atomic<T>, kMaxDevices> slots_{};
};

// Raises `kernel`'s dynamic shared-memory limit to `bytes` on the current
// device when it needs more than the default. `allowed` remembers the limit
// set per device, so calls inside a stream capture that follow a first,
// uncaptured call on that device make no attribute call at all.
template <typename Kernel>
cudaError_t AllowSharedBytes(Kernel kernel, size_t bytes, PerDevice<size_t>* allowed) {
  if (bytes <= 48 * 1024) return cudaSuccess;
  std::atomic<size_t>* slot = allowed->Current();
  if (slot != nullptr && bytes <= slot->load(std::memory_order_relaxed)) return cudaSuccess;
  const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               static_cast<int>(bytes));
  if (err == cudaSuccess && slot != nullptr) slot->store(bytes, std::memory_order_relaxed);
  return err;
}

// Launches `kernel`, with programmatic stream serialization when `pdl`: the
// kernel may start while the one before it in the stream finishes and waits
// for it inside (griddepcontrol.wait); without it, it starts after.
template <typename... Params, typename... Args>
cudaError_t LaunchPdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                      cudaStream_t stream, bool pdl, Args... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, kernel, static_cast<Params>(args)...);
}

}  // namespace flotilla::kernels::cuda
