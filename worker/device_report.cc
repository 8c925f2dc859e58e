#include "worker/device_report.h"

#include <unistd.h>

#include <cstdlib>
#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/build_info.h"
#if FLOTILLA_WITH_CUDA
#include "kernels/cuda/device.h"
#endif

namespace flotilla::worker {

std::string HostId() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  if (in >> id && !id.empty()) return std::string(absl::StripAsciiWhitespace(id));
  char name[256] = {0};
  if (gethostname(name, sizeof(name) - 1) == 0) return name;
  return "";
}

absl::Status CheckCudaDevice(int ordinal) {
#if FLOTILLA_WITH_CUDA
  const int visible = kernels::cuda::DeviceCount();
  if (ordinal >= 0 && ordinal < visible) return absl::OkStatus();
  const char* mask = std::getenv("CUDA_VISIBLE_DEVICES");
  return absl::FailedPreconditionError(
      absl::StrCat("--device cuda: there is no CUDA device ", ordinal, " (", visible, " visible",
                   mask == nullptr ? "" : absl::StrCat(", CUDA_VISIBLE_DEVICES=", mask),
                   visible == 0 ? "; no GPU or no driver" : "", ")"));
#else
  (void)ordinal;
  return absl::FailedPreconditionError("--device cuda: this worker was built without CUDA");
#endif
}

void DescribeCudaDevice(int ordinal, common::DeviceInfo* device) {
#if FLOTILLA_WITH_CUDA
  kernels::cuda::DeviceProps props;
  if (!kernels::cuda::GetDeviceProps(ordinal, &props)) return;
  device->set_kind(common::DeviceInfo::CUDA);
  device->set_index(ordinal);
  device->set_name(props.name);
  device->set_memory_bytes(props.memory_bytes);
  device->set_compute_capability(props.compute_capability);
  device->set_uuid(props.uuid);
  uint64_t free_bytes = 0, total_bytes = 0;
  if (kernels::cuda::GetDeviceMemory(ordinal, &free_bytes, &total_bytes)) {
    device->set_free_memory_bytes(free_bytes);
  }
#else
  (void)ordinal;
  (void)device;
#endif
}

std::vector<cluster::DeviceTransport> DeviceTransports(const common::DeviceInfo& device) {
  if (device.kind() != common::DeviceInfo::CUDA) return {};
  std::vector<cluster::DeviceTransport> transports = {cluster::DEVICE_TRANSPORT_CUDA_IPC};
  if (GetBuildInfo().nccl) transports.push_back(cluster::DEVICE_TRANSPORT_NCCL);
  return transports;
}

}  // namespace flotilla::worker
