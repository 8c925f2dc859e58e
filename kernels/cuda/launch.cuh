// Host helper shared by the CUDA kernels' launchers. Included by .cu files only.
#pragma once

#include <cuda_runtime.h>

namespace flotilla::kernels::cuda {

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
