// A CUDA runtime call's result as a Status, for the GPU engine's sources.
#pragma once

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace flotilla {

// OK for cudaSuccess; else INTERNAL "cuda: what: <the runtime's message>".
inline absl::Status CudaStatus(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("cuda: ", what, ": ", cudaGetErrorString(err)));
}

// Returns CudaStatus of `expr`, named by its text, when it is not cudaSuccess.
#define FLOTILLA_CUDA_RETURN(expr) FLOTILLA_RETURN_IF_ERROR(::flotilla::CudaStatus((expr), #expr))

}  // namespace flotilla
