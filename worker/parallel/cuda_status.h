// CUDA runtime errors as absl::Status for the device context's host code.
#pragma once

#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace flotilla::parallel {

inline absl::Status CudaStatus(cudaError_t err, absl::string_view what) {
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("cuda: ", what, ": ", cudaGetErrorString(err)));
}

}  // namespace flotilla::parallel

#define FLOTILLA_CUDA_RETURN_IF_ERROR(expr) \
  FLOTILLA_RETURN_IF_ERROR(::flotilla::parallel::CudaStatus((expr), #expr))
