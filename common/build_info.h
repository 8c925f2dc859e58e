// What this binary was built with; printed by `flotilla info` and reported by
// workers when they register.
#pragma once

#include <string>

namespace flotilla {

struct BuildInfo {
  std::string version;
  bool cuda = false;
  bool nccl = false;
  bool ucx = false;
  bool sanitize = false;
  std::string build_type;
};

const BuildInfo& GetBuildInfo();

}  // namespace flotilla
