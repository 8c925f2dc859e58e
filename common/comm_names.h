// Names of the communicator settings of cluster.proto (the host backend and
// the device transport) as flags, environment variables, logs and operators
// spell them, and the one parser that turns a name into its enum: a value no
// parser accepts is refused with the accepted names, never mapped to a
// default.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/cluster.pb.h"

namespace flotilla {

// "none", "ucx"; "unknown (N)" for a value this build does not know.
std::string CommBackendName(cluster::CommBackend backend);

// "ucx" -> UCX; anything else is INVALID_ARGUMENT naming the accepted values
// ("none" is the coordinator's choice for one rank, never a setting).
absl::StatusOr<cluster::CommBackend> ParseCommBackend(absl::string_view name);

// "cuda-ipc", "nccl"; "auto" for UNSPECIFIED (as a request: let placement
// choose); "unknown (N)" otherwise.
std::string DeviceTransportName(cluster::DeviceTransport transport);

// "auto" -> UNSPECIFIED, "cuda-ipc", "nccl"; anything else is
// INVALID_ARGUMENT naming the accepted values.
absl::StatusOr<cluster::DeviceTransport> ParseDeviceTransport(absl::string_view name);

// The accepted names, for --help: "ucx" and "auto, cuda-ipc, nccl".
inline constexpr char kCommBackendNames[] = "ucx";
inline constexpr char kDeviceTransportNames[] = "auto, cuda-ipc, nccl";

}  // namespace flotilla
