#include "tools/cli/child_output.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>

#include "common/logging.h"
#include "nlohmann/json.hpp"

namespace flotilla::cli {
namespace {

// A line longer than this is passed on in pieces.
constexpr size_t kMaxLine = 64 * 1024;

void WriteLine(const std::string& line) {
  // One fwrite per line: stdio locks stderr for it, so lines from several
  // children and from up's own logger never interleave.
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

}  // namespace

std::string AsJsonLogLine(std::string_view line, const std::string& tag) {
  if (!line.empty() && line.front() == '{' && nlohmann::json::accept(line)) {
    return std::string(line) + "\n";
  }
  return JsonEventLine(spdlog::level::info, line, {{"process", tag}, {"stream", "output"}});
}

ChildOutput::ChildOutput(int fd, std::string tag)
    : fd_(fd), tag_(std::move(tag)), thread_([this] { Run(); }) {}

ChildOutput::~ChildOutput() {
  if (thread_.joinable()) thread_.join();
}

void ChildOutput::Run() {
  std::string pending;
  char buf[4096];
  for (;;) {
    const ssize_t n = read(fd_, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    pending.append(buf, static_cast<size_t>(n));
    size_t start = 0;
    for (size_t nl; (nl = pending.find('\n', start)) != std::string::npos; start = nl + 1) {
      WriteLine(AsJsonLogLine(std::string_view(pending).substr(start, nl - start), tag_));
    }
    pending.erase(0, start);
    if (pending.size() >= kMaxLine) {
      WriteLine(AsJsonLogLine(pending, tag_));
      pending.clear();
    }
  }
  if (!pending.empty()) WriteLine(AsJsonLogLine(pending, tag_));
  close(fd_);
  done_ = true;
}

}  // namespace flotilla::cli
