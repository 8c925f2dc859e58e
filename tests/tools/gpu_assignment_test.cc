#include "tools/cli/gpu_assignment.h"

#include <gtest/gtest.h>

namespace flotilla::cli {
namespace {

TEST(GpuAssignment, WorkersCycleOverTheVisibleGpus) {
  EXPECT_EQ(*AssignWorkerGpus(8, {}, 8), (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(*AssignWorkerGpus(2, {}, 8), (std::vector<int>{0, 1}));
  // More workers than GPUs: several per GPU (how one GPU tests a sharded instance).
  EXPECT_EQ(*AssignWorkerGpus(4, {}, 1), (std::vector<int>{0, 0, 0, 0}));
  EXPECT_EQ(*AssignWorkerGpus(5, {}, 2), (std::vector<int>{0, 1, 0, 1, 0}));
}

TEST(GpuAssignment, GpusFlagPicksTheOrdinals) {
  EXPECT_EQ(*AssignWorkerGpus(4, {2, 3}, 4), (std::vector<int>{2, 3, 2, 3}));
  auto s = AssignWorkerGpus(2, {0, 4}, 4);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("GPU 4 is not visible; ordinals go from 0 to 3"),
            std::string::npos)
      << s.status();
  s = AssignWorkerGpus(2, {1, 1}, 4);
  EXPECT_NE(s.status().message().find("twice"), std::string::npos) << s.status();
}

TEST(GpuAssignment, NoGpuIsRefused) {
  EXPECT_EQ(AssignWorkerGpus(1, {}, 0).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(AssignWorkerGpus(0, {}, 1).ok());
}

}  // namespace
}  // namespace flotilla::cli
