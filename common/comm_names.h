// Names of the layout settings of cluster.proto (the host backend, the
// device transport, the MoE layout) as flags, environment variables, logs and operators
// spell them, and the one parser that turns a name into its enum: a value no
// parser accepts is refused with the accepted names, never mapped to a
// default.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/parallel_config.h"
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

// "auto" -> UNSPECIFIED (let placement choose), "ep", "tp"; anything else is
// INVALID_ARGUMENT naming the accepted values.
absl::StatusOr<cluster::MoeLayout> ParseMoeLayout(absl::string_view name);
// The proto's layout as ParallelConfig's (UNSPECIFIED: expert parallel) and back.
MoeLayout ToMoeLayout(cluster::MoeLayout layout);
cluster::MoeLayout ToProto(MoeLayout layout);

// The accepted names, for --help: "ucx", "auto, cuda-ipc, nccl", "auto, ep, tp".
inline constexpr char kCommBackendNames[] = "ucx";
inline constexpr char kDeviceTransportNames[] = "auto, cuda-ipc, nccl";
inline constexpr char kMoeLayoutNames[] = "auto, ep, tp";

}  // namespace flotilla
