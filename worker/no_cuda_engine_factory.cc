// The "cuda" factory of a build without CUDA: it refuses.
#include "worker/engine_factory.h"

namespace flotilla::worker {
namespace {

class NoCudaEngineFactory final : public EngineFactory {
 public:
  absl::StatusOr<RankEngine> Create(EngineSpec) override {
    return absl::FailedPreconditionError("--device cuda: this worker was built without CUDA");
  }
};

}  // namespace

std::unique_ptr<EngineFactory> MakeCudaEngineFactory() {
  return std::make_unique<NoCudaEngineFactory>();
}

}  // namespace flotilla::worker
