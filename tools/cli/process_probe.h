// What /proc says about a process: its resident memory, open descriptors and
// children. The soak program watches the coordinator with it and finds the
// workers of a `flotilla up` to kill.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

namespace flotilla::cli {

struct ProcessSample {
  long rss_kb = 0;
  int open_fds = 0;
};

// The sample of `pid`; nullopt when it is gone or unreadable.
std::optional<ProcessSample> SampleProcess(pid_t pid);

// Children of `parent` whose executable's name is `name` (e.g. "flotilla-worker").
std::vector<pid_t> ChildrenNamed(pid_t parent, const std::string& name);

}  // namespace flotilla::cli
