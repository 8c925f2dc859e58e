// The CUDA engine's options for the small test models (the tiny preset):
// a few sequences of a few hundred tokens, so a test's engine takes little
// of a GPU that others share.
#pragma once

#include <cstdint>

#include "kernels/cuda/device.h"
#include "worker/engine/cuda_engine.h"

namespace flotilla::testing_util {

// `blocks` KV blocks, sequences of up to `context` tokens, steps of up to
// `batch_tokens` tokens of at most `sequences` sequences.
inline CudaEngineOptions SmallCudaOptions(int64_t blocks = 64, int64_t context = 512,
                                          int batch_tokens = 256, int sequences = 4) {
  CudaEngineOptions o;
  o.kv_num_blocks = blocks;
  o.max_context = context;
  o.max_batch_tokens = batch_tokens;
  o.max_sequences = sequences;
  return o;
}

// Whether a CUDA device is present (GPU tests skip without one).
inline bool HaveGpu() { return kernels::cuda::DeviceCount() > 0; }

}  // namespace flotilla::testing_util
