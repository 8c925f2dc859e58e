#include "common/comm_names.h"

#include "absl/strings/str_cat.h"

namespace flotilla {

std::string CommBackendName(cluster::CommBackend backend) {
  switch (backend) {
    case cluster::COMM_BACKEND_NONE:
      return "none";
    case cluster::COMM_BACKEND_UCX:
      return "ucx";
    default:
      return absl::StrCat("unknown (", static_cast<int>(backend), ")");
  }
}

absl::StatusOr<cluster::CommBackend> ParseCommBackend(absl::string_view name) {
  if (name == "ucx") return cluster::COMM_BACKEND_UCX;
  std::string hint;
  // NCCL moves device buffers beside the host communicator, never instead of it.
  if (name == "nccl") hint = " (NCCL between GPUs is --device-transport nccl)";
  return absl::InvalidArgumentError(
      absl::StrCat("'", name, "' is not a host communicator; accepted: ", kCommBackendNames, hint));
}

std::string DeviceTransportName(cluster::DeviceTransport transport) {
  switch (transport) {
    case cluster::DEVICE_TRANSPORT_UNSPECIFIED:
      return "auto";
    case cluster::DEVICE_TRANSPORT_CUDA_IPC:
      return "cuda-ipc";
    case cluster::DEVICE_TRANSPORT_NCCL:
      return "nccl";
    default:
      return absl::StrCat("unknown (", static_cast<int>(transport), ")");
  }
}

absl::StatusOr<cluster::DeviceTransport> ParseDeviceTransport(absl::string_view name) {
  if (name == "auto") return cluster::DEVICE_TRANSPORT_UNSPECIFIED;
  if (name == "cuda-ipc") return cluster::DEVICE_TRANSPORT_CUDA_IPC;
  if (name == "nccl") return cluster::DEVICE_TRANSPORT_NCCL;
  return absl::InvalidArgumentError(
      absl::StrCat("'", name, "' is not a device transport; accepted: ", kDeviceTransportNames));
}

absl::StatusOr<cluster::MoeLayout> ParseMoeLayout(absl::string_view name) {
  if (name == "auto") return cluster::MOE_LAYOUT_UNSPECIFIED;
  if (name == "ep") return cluster::MOE_LAYOUT_EP;
  if (name == "tp") return cluster::MOE_LAYOUT_TP;
  return absl::InvalidArgumentError(
      absl::StrCat("'", name, "' is not a MoE layout; accepted: ", kMoeLayoutNames));
}

MoeLayout ToMoeLayout(cluster::MoeLayout layout) {
  return layout == cluster::MOE_LAYOUT_TP ? MoeLayout::kTensorParallel : MoeLayout::kExpertParallel;
}

cluster::MoeLayout ToProto(MoeLayout layout) {
  return layout == MoeLayout::kTensorParallel ? cluster::MOE_LAYOUT_TP : cluster::MOE_LAYOUT_EP;
}

}  // namespace flotilla
