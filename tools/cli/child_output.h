// `flotilla up --log-format json` promises one JSON object a line. Its
// children log JSON, but libraries inside them (UCX, NCCL, the CUDA driver)
// print plain text for themselves; so, under JSON logs, up reads each child's
// stdout and stderr through a pipe and passes every line on to its own
// stderr: JSON objects as they are, other lines wrapped in one.
#pragma once

#include <atomic>
#include <string>
#include <string_view>
#include <thread>

namespace flotilla::cli {

// `line` (no newline) as a JSON log line with its newline: unchanged when it
// is already a JSON object, else {"time", "level": "info", "msg": line,
// "process": tag, "stream": "output"}.
std::string AsJsonLogLine(std::string_view line, const std::string& tag);

// Forwards one child's output: reads `fd` (the read end of the pipe that is
// the child's stdout and stderr) on its own thread until every writer closed
// it, then closes it.
class ChildOutput {
 public:
  ChildOutput(int fd, std::string tag);
  ~ChildOutput();  // waits for the end of the output (the child exited)
  ChildOutput(const ChildOutput&) = delete;
  ChildOutput& operator=(const ChildOutput&) = delete;

  bool done() const { return done_.load(); }

 private:
  void Run();

  const int fd_;
  const std::string tag_;
  std::atomic<bool> done_{false};
  std::thread thread_;
};

}  // namespace flotilla::cli
