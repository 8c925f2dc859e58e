// FLOTILLA_HOST_DEVICE marks a function that CUDA device code may call too
// (nvcc compiles it for both sides); plain C++ compilers see an ordinary inline.
#pragma once

#if defined(__CUDACC__)
#define FLOTILLA_HOST_DEVICE __host__ __device__
#else
#define FLOTILLA_HOST_DEVICE
#endif
