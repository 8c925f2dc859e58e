// What the CUDA benchmarks share: arbitrary device data from a cheap
// per-element hash of the index and a seed (not the synthetic checkpoint's
// values, which are common/synthetic_fill.h's), event timing, and their
// comma-separated list flags.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

// The hash of element `i` under `seed`.
__device__ __forceinline__ uint32_t BenchHash(size_t i, uint32_t seed) {
  uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
  h ^= h >> 15;
  h *= 2246822519u;
  h ^= h >> 13;
  return h;
}

// Runs `warm`, then times `run` with CUDA events on `stream` (both enqueue
// their work there; `run` returns its first launch error, else cudaSuccess):
// `*ms` is how long `run`'s work took on the device. Returns the first error
// of `run` or of the stream.
template <typename Warm, typename Run>
cudaError_t EventMs(cudaStream_t stream, Warm warm, Run run, float* ms) {
  cudaEvent_t start, end;
  cudaEventCreate(&start);
  cudaEventCreate(&end);
  warm();
  cudaEventRecord(start, stream);
  cudaError_t err = run();
  cudaEventRecord(end, stream);
  const cudaError_t synced = cudaEventSynchronize(end);
  if (err == cudaSuccess) err = synced;
  *ms = 0;
  if (err == cudaSuccess) cudaEventElapsedTime(ms, start, end);
  cudaEventDestroy(start);
  cudaEventDestroy(end);
  return err;
}

// Times `replays` replays of `exec` on `stream`, after two untimed ones.
inline cudaError_t GraphMs(cudaStream_t stream, cudaGraphExec_t exec, int replays, float* ms) {
  return EventMs(
      stream,
      [&] {
        for (int i = 0; i < 2; ++i) cudaGraphLaunch(exec, stream);
      },
      [&] {
        for (int i = 0; i < replays; ++i) cudaGraphLaunch(exec, stream);
        return cudaSuccess;
      },
      ms);
}

// "1,8,64" -> {1, 8, 64}.
inline std::vector<long> ParseList(const char* s) {
  std::vector<long> v;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) v.push_back(std::strtol(item.c_str(), nullptr, 10));
  return v;
}
