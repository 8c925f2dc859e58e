// Side streams per thread and device; see side_stream.h.
#include "kernels/cuda/side_stream.h"

#include <cuda_runtime.h>

#include <array>

namespace flotilla::kernels::cuda {
namespace {

constexpr int kMaxDevices = 64;

// One thread's side streams, one per device, released at thread exit
// (errors ignored: at process exit the runtime may already be gone).
class ThreadSideStreams {
 public:
  ThreadSideStreams() = default;
  ThreadSideStreams(const ThreadSideStreams&) = delete;
  ThreadSideStreams& operator=(const ThreadSideStreams&) = delete;
  ~ThreadSideStreams() {
    for (SideStream& s : slots_) {
      if (s.join != nullptr) cudaEventDestroy(s.join);
      if (s.fork != nullptr) cudaEventDestroy(s.fork);
      if (s.stream != nullptr) cudaStreamDestroy(s.stream);
    }
  }
  SideStream& Slot(int device) { return slots_[device]; }

 private:
  std::array<SideStream, kMaxDevices> slots_{};
};

cudaError_t Create(SideStream* s) {
  SideStream made;
  int least = 0, greatest = 0;
  cudaError_t err = cudaDeviceGetStreamPriorityRange(&least, &greatest);
  if (err == cudaSuccess) {
    err = cudaStreamCreateWithPriority(&made.stream, cudaStreamNonBlocking, greatest);
  }
  if (err == cudaSuccess) err = cudaEventCreateWithFlags(&made.fork, cudaEventDisableTiming);
  if (err == cudaSuccess) err = cudaEventCreateWithFlags(&made.join, cudaEventDisableTiming);
  if (err == cudaSuccess) {
    *s = made;
    return cudaSuccess;
  }
  if (made.fork != nullptr) cudaEventDestroy(made.fork);
  if (made.stream != nullptr) cudaStreamDestroy(made.stream);
  return err;
}

}  // namespace

cudaError_t CurrentSideStream(cudaStream_t stream, SideStream* out) {
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  if (device < 0 || device >= kMaxDevices) return cudaErrorInvalidDevice;
  thread_local ThreadSideStreams streams;
  SideStream& s = streams.Slot(device);
  if (s.join == nullptr) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    err = cudaStreamIsCapturing(stream, &capture);
    if (err != cudaSuccess) return err;
    if (capture != cudaStreamCaptureStatusNone) return cudaErrorNotReady;
    err = Create(&s);
    if (err != cudaSuccess) return err;
  }
  *out = s;
  return cudaSuccess;
}

cudaError_t ForkToSide(cudaStream_t stream, const SideStream& side) {
  const cudaError_t err = cudaEventRecord(side.fork, stream);
  return err != cudaSuccess ? err : cudaStreamWaitEvent(side.stream, side.fork, 0);
}

cudaError_t JoinFromSide(cudaStream_t stream, const SideStream& side) {
  const cudaError_t err = cudaEventRecord(side.join, side.stream);
  return err != cudaSuccess ? err : cudaStreamWaitEvent(stream, side.join, 0);
}

}  // namespace flotilla::kernels::cuda
