// CUDA runtime errors as absl::Status for host code that calls the CUDA
// runtime (the device parallel context and the device transports in comm/).
// Include only from targets built with CUDA.
#pragma once

#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/status.h"

namespace flotilla {

inline absl::Status CudaStatus(cudaError_t err, absl::string_view what) {
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("cuda: ", what, ": ", cudaGetErrorString(err)));
}

}  // namespace flotilla

#define FLOTILLA_CUDA_RETURN_IF_ERROR(expr) \
  FLOTILLA_RETURN_IF_ERROR(::flotilla::CudaStatus((expr), #expr))
