// flotillactl's commands. Each returns the process exit code: 0 done, 1 the
// coordinator refused or failed (its status printed), 2 bad input.
#pragma once

#include <string>

#include "tools/ctl/ctl_connection.h"

namespace flotilla::ctl {

struct OutputOptions {
  bool json = false;
};

int RunStatus(Connection& c, const OutputOptions& out);
struct ExpertsOptions {
  int layer = -1;       // -1: every layer
  double window_s = 0;  // 0: the coordinator's default
  double watch_s = 0;   // > 0: refresh every watch_s seconds until interrupted
  int watch_count = 0;  // with watch: stop after this many (0 = never)
  uint32_t instance = 0;  // which model instance
};
int RunExperts(Connection& c, const ExpertsOptions& o, const OutputOptions& out);
struct RebalanceOptions {
  bool dry_run = false;
  uint64_t max_bytes = 0;
  double window_s = 0;
  uint32_t instance = 0;  // which model instance
};
int RunRebalance(Connection& c, const RebalanceOptions& o, const OutputOptions& out);
// Drains (or undrains) WORKER's DP group, or with `instance` >= 0 a whole instance.
int RunDrain(Connection& c, const std::string& worker, int instance, bool drain,
             const OutputOptions& out);
int RunGetExpertMap(Connection& c, uint32_t instance, const OutputOptions& out);
int RunSetExpertMap(Connection& c, const std::string& file, const OutputOptions& out);

}  // namespace flotilla::ctl
