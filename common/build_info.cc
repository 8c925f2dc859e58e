#include "common/build_info.h"

namespace flotilla {

const BuildInfo& GetBuildInfo() {
  static const BuildInfo* info = [] {
    auto* b = new BuildInfo;
    b->version = FLOTILLA_VERSION;
    b->cuda = FLOTILLA_WITH_CUDA;
    b->nccl = FLOTILLA_WITH_NCCL;
    b->ucx = FLOTILLA_WITH_UCX;
    b->sanitize = FLOTILLA_WITH_SANITIZE;
    b->build_type = FLOTILLA_BUILD_TYPE;
    return b;
  }();
  return *info;
}

}  // namespace flotilla
