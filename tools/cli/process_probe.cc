#include "tools/cli/process_probe.h"

#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>

namespace flotilla::cli {
namespace fs = std::filesystem;

std::optional<ProcessSample> SampleProcess(pid_t pid) {
  const fs::path dir = fs::path("/proc") / std::to_string(pid);
  std::ifstream status(dir / "status");
  if (!status) return std::nullopt;
  ProcessSample sample;
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) sample.rss_kb = std::stol(line.substr(6));
  }
  std::error_code ec;
  for (auto it = fs::directory_iterator(dir / "fd", ec); !ec && it != fs::directory_iterator();
       it.increment(ec)) {
    ++sample.open_fds;
  }
  if (ec) return std::nullopt;
  return sample;
}

std::vector<pid_t> ChildrenNamed(pid_t parent, const std::string& name) {
  std::vector<pid_t> children;
  std::error_code ec;
  for (auto it = fs::directory_iterator("/proc", ec); !ec && it != fs::directory_iterator();
       it.increment(ec)) {
    const std::string pid = it->path().filename().string();
    if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(it->path() / "stat");
    std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
    // "PID (COMM) STATE PPID ...": COMM may hold spaces, so read after the last ')'.
    const size_t open = text.find('('), close = text.rfind(')');
    if (open == std::string::npos || close == std::string::npos) continue;
    std::istringstream rest(text.substr(close + 1));
    std::string state;
    pid_t ppid = 0;
    rest >> state >> ppid;
    // COMM is the name cut to 15 characters.
    if (ppid == parent && state != "Z" &&
        text.substr(open + 1, close - open - 1) == name.substr(0, 15)) {
      children.push_back(static_cast<pid_t>(std::stol(pid)));
    }
  }
  return children;
}

}  // namespace flotilla::cli
