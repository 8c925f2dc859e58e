#include "worker/device_report.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "common/build_info.h"

namespace flotilla::worker {
namespace {

TEST(DeviceReport, HostIdIsStableWithinTheMachine) {
  const std::string id = HostId();
  EXPECT_FALSE(id.empty());
  EXPECT_EQ(HostId(), id);
}

TEST(DeviceReport, CpuWorkersOfferNoDeviceTransport) {
  common::DeviceInfo cpu;
  cpu.set_kind(common::DeviceInfo::CPU);
  EXPECT_TRUE(DeviceTransports(cpu).empty());
}

TEST(DeviceReport, GpuWorkersOfferCudaIpcAndNcclWhenBuiltWithIt) {
  common::DeviceInfo gpu;
  gpu.set_kind(common::DeviceInfo::CUDA);
  const std::vector<cluster::DeviceTransport> t = DeviceTransports(gpu);
  EXPECT_NE(std::find(t.begin(), t.end(), cluster::DEVICE_TRANSPORT_CUDA_IPC), t.end());
  EXPECT_EQ(std::find(t.begin(), t.end(), cluster::DEVICE_TRANSPORT_NCCL) != t.end(),
            GetBuildInfo().nccl);
}

TEST(DeviceReport, AMissingGpuIsRefusedWithTheReason) {
  const absl::Status s = CheckCudaDevice(-1);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("--device cuda"), std::string::npos) << s;
  EXPECT_FALSE(CheckCudaDevice(1 << 20).ok());
}

}  // namespace
}  // namespace flotilla::worker
