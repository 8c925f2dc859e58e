// The Hello's GPU description against the real device (skipped without one).
#include <gtest/gtest.h>

#include "worker/device_report.h"

namespace flotilla::worker {
namespace {

TEST(DeviceReportCuda, DescribesTheGpuWithItsUuidAndFreeMemory) {
  if (!CheckCudaDevice(0).ok()) GTEST_SKIP() << "no GPU";
  common::DeviceInfo d;
  DescribeCudaDevice(0, &d);
  EXPECT_EQ(d.kind(), common::DeviceInfo::CUDA);
  EXPECT_EQ(d.index(), 0);
  EXPECT_FALSE(d.name().empty());
  EXPECT_GE(d.compute_capability(), 70);
  EXPECT_GT(d.memory_bytes(), uint64_t{1} << 30);
  EXPECT_GT(d.free_memory_bytes(), 0u);
  EXPECT_LE(d.free_memory_bytes(), d.memory_bytes());
  ASSERT_EQ(d.uuid().size(), 40u) << d.uuid();  // GPU- and 36 characters
  EXPECT_EQ(d.uuid().substr(0, 4), "GPU-");
  // The same GPU gives the same UUID (how placement finds shared GPUs).
  common::DeviceInfo again;
  DescribeCudaDevice(0, &again);
  EXPECT_EQ(again.uuid(), d.uuid());
}

}  // namespace
}  // namespace flotilla::worker
