#include "common/comm_names.h"

#include <optional>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "common/enum_names.h"

namespace flotilla {
namespace {

// "none" is the coordinator's choice for one rank, never a setting, so the
// parser below does not read this table.
constexpr EnumName<cluster::CommBackend> kCommBackends[] = {{cluster::COMM_BACKEND_NONE, "none"},
                                                            {cluster::COMM_BACKEND_UCX, "ucx"}};
constexpr EnumName<cluster::DeviceTransport> kDeviceTransports[] = {
    {cluster::DEVICE_TRANSPORT_UNSPECIFIED, "auto"},
    {cluster::DEVICE_TRANSPORT_CUDA_IPC, "cuda-ipc"},
    {cluster::DEVICE_TRANSPORT_NCCL, "nccl"}};
constexpr EnumName<cluster::MoeLayout> kMoeLayouts[] = {{cluster::MOE_LAYOUT_UNSPECIFIED, "auto"},
                                                        {cluster::MOE_LAYOUT_EP, "ep"},
                                                        {cluster::MOE_LAYOUT_TP, "tp"}};

template <typename E, size_t N>
std::string NameOrUnknown(const EnumName<E> (&table)[N], E value) {
  const char* name = NameIn(table, value);
  return name != nullptr ? name : absl::StrCat("unknown (", static_cast<int>(value), ")");
}

// The value `table` names, or INVALID_ARGUMENT: "'x' is not a `what`;
// accepted: ...".
template <typename E, size_t N>
absl::StatusOr<E> ParseIn(const EnumName<E> (&table)[N], absl::string_view name,
                          absl::string_view what) {
  if (std::optional<E> value = ValueIn(table, std::string_view(name.data(), name.size()))) {
    return *value;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("'", name, "' is not a ", what, "; accepted: ", NamesIn(table)));
}

}  // namespace

std::string CommBackendName(cluster::CommBackend backend) {
  return NameOrUnknown(kCommBackends, backend);
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
  return NameOrUnknown(kDeviceTransports, transport);
}

absl::StatusOr<cluster::DeviceTransport> ParseDeviceTransport(absl::string_view name) {
  return ParseIn(kDeviceTransports, name, "device transport");
}

absl::StatusOr<cluster::MoeLayout> ParseMoeLayout(absl::string_view name) {
  return ParseIn(kMoeLayouts, name, "MoE layout");
}

MoeLayout ToMoeLayout(cluster::MoeLayout layout) {
  return layout == cluster::MOE_LAYOUT_TP ? MoeLayout::kTensorParallel : MoeLayout::kExpertParallel;
}

cluster::MoeLayout ToProto(MoeLayout layout) {
  return layout == MoeLayout::kTensorParallel ? cluster::MOE_LAYOUT_TP : cluster::MOE_LAYOUT_EP;
}

}  // namespace flotilla
