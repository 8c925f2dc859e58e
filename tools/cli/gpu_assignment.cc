#include "tools/cli/gpu_assignment.h"

#include <cstdlib>
#include <set>

#include "absl/strings/str_cat.h"
#if FLOTILLA_WITH_CUDA
#include "kernels/cuda/device.h"
#endif

namespace flotilla::cli {

absl::StatusOr<int> VisibleGpus() {
#if FLOTILLA_WITH_CUDA
  const int visible = kernels::cuda::DeviceCount();
  if (visible > 0) return visible;
  const char* mask = std::getenv("CUDA_VISIBLE_DEVICES");
  return absl::FailedPreconditionError(
      absl::StrCat("--device cuda: no CUDA GPU is visible (",
                   mask == nullptr ? "no GPU or no driver on this machine"
                                   : absl::StrCat("CUDA_VISIBLE_DEVICES=", mask),
                   "); run with --device cpu"));
#else
  return absl::FailedPreconditionError(
      "--device cuda: this build has no CUDA support (configure with FLOTILLA_CUDA=ON); run with "
      "--device cpu");
#endif
}

absl::StatusOr<std::vector<int>> AssignWorkerGpus(int workers, const std::vector<int>& requested,
                                                  int visible) {
  if (workers < 1) return absl::InvalidArgumentError("--workers must be >= 1");
  if (visible < 1) return absl::FailedPreconditionError("no CUDA GPU is visible");
  std::vector<int> gpus = requested;
  if (gpus.empty()) {
    for (int g = 0; g < visible; ++g) gpus.push_back(g);
  }
  std::set<int> seen;
  for (int g : gpus) {
    if (g < 0 || g >= visible) {
      return absl::InvalidArgumentError(
          absl::StrCat("--gpus: GPU ", g, " is not visible; ordinals go from 0 to ", visible - 1,
                       " (CUDA_VISIBLE_DEVICES renumbers the GPUs it keeps from 0)"));
    }
    if (!seen.insert(g).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("--gpus names GPU ", g, " twice; more --workers than GPUs share them"));
    }
  }
  std::vector<int> assigned;
  for (int i = 0; i < workers; ++i) assigned.push_back(gpus[i % gpus.size()]);
  return assigned;
}

}  // namespace flotilla::cli
