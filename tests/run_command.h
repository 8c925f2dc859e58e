// Runs a shell command from a test and returns its exit code and output.
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>
#include <utility>

namespace flotilla::testing_util {

// {exit code (-1 when it did not exit normally), what it printed on stdout}.
inline std::pair<int, std::string> RunCommand(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return {-1, ""};
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  const int rc = pclose(p);
  return {WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, out};
}

// The same with stderr in the output too.
inline std::pair<int, std::string> RunCommandWithStderr(const std::string& cmd) {
  return RunCommand(cmd + " 2>&1");
}

}  // namespace flotilla::testing_util
