// The local cluster most end-to-end tests start: a few worker processes of
// one thread each, the programs from FLOTILLA_BIN_DIR (defined by the test's
// target), the children's logs in a directory of the test's own. A test
// changes what its subject needs (timeouts, flags, TLS) on the returned
// options.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <utility>

#include "tools/cli/local_cluster.h"

namespace flotilla::testing_util {

// flotilla-TAG-PID under the temporary directory: one test's children's logs,
// apart from other test processes'.
inline std::string TestLogDir(const std::string& tag) {
  return (std::filesystem::temp_directory_path() /
          ("flotilla-" + tag + "-" + std::to_string(getpid())))
      .string();
}

// `workers` workers of one thread serving `model` (empty: the built-in model)
// in layouts of `tp` ranks (0: automatic); the logs in TestLogDir(log_tag), or
// on this process's stderr when `log_tag` is empty.
inline cli::LocalClusterOptions TestClusterOptions(const std::string& model, int workers,
                                                   int tp = 0, const std::string& log_tag = "") {
  cli::LocalClusterOptions options;
  options.model = model;
  options.workers = workers;
  options.tp = tp;
  options.threads_per_worker = 1;
  options.bin_dir = FLOTILLA_BIN_DIR;
  if (!log_tag.empty()) options.log_dir = TestLogDir(log_tag);
  return options;
}

// A test name for a (workers, tp) layout parameter: W2_TP1.
inline std::string LayoutName(const ::testing::TestParamInfo<std::pair<int, int>>& info) {
  return "W" + std::to_string(info.param.first) + "_TP" + std::to_string(info.param.second);
}

}  // namespace flotilla::testing_util
