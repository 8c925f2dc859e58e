// Conversion between absl::Status (used everywhere inside the project) and
// grpc::Status (used only at RPC edges).
#pragma once

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace flotilla {

// Same code and message; absl and gRPC share the canonical code numbering.
grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace flotilla
