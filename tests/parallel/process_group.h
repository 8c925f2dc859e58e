// Runs ranks of a test as separate processes: this test binary again
// (/proc/self/exe) with the arguments the test gives, each rank's output in
// a log file of a temporary directory that the ranks also share for their
// bootstrap (comm/file). Stragglers are killed, never waited for forever.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace flotilla::parallel::testing {

class ProcessGroup {
 public:
  struct Rank {
    pid_t pid = -1;
    int exit_code = -1;  // -1 while running; 999 when killed as hung
    std::string log;
  };

  ProcessGroup() {
    char tmpl[] = "/tmp/flotilla_parallel_test.XXXXXX";
    dir_ = mkdtemp(tmpl);
  }
  ~ProcessGroup() {
    for (Rank& r : ranks_) {
      if (r.pid > 0 && r.exit_code == -1) {
        kill(r.pid, SIGKILL);
        waitpid(r.pid, nullptr, 0);
      }
    }
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  const std::string& dir() const { return dir_; }

  // Starts one process with `args` (after the program name); false when it
  // could not be started.
  bool Start(const std::vector<std::string>& args) {
    std::vector<std::string> all = {"/proc/self/exe"};
    all.insert(all.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : all) argv.push_back(a.data());
    argv.push_back(nullptr);
    const std::string log = LogPath(static_cast<int>(ranks_.size()));
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
    Rank r;
    const int rc = posix_spawn(&r.pid, argv[0], &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    if (rc != 0) return false;
    ranks_.push_back(r);
    return true;
  }

  // Waits for every process, killing those still running after `limit`,
  // then reads the logs.
  void Wait(std::chrono::seconds limit) {
    const auto end = std::chrono::steady_clock::now() + limit;
    for (Rank& r : ranks_) {
      while (r.exit_code == -1) {
        int status = 0;
        if (waitpid(r.pid, &status, WNOHANG) == r.pid) {
          r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        } else if (std::chrono::steady_clock::now() > end) {
          kill(r.pid, SIGKILL);
          waitpid(r.pid, nullptr, 0);
          r.exit_code = 999;
        } else {
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
      }
    }
    for (size_t i = 0; i < ranks_.size(); ++i) {
      std::ifstream in(LogPath(static_cast<int>(i)));
      std::stringstream ss;
      ss << in.rdbuf();
      ranks_[i].log = ss.str();
    }
  }

  int size() const { return static_cast<int>(ranks_.size()); }
  const Rank& rank(int i) const { return ranks_[static_cast<size_t>(i)]; }

 private:
  std::string LogPath(int rank) const { return dir_ + "/log." + std::to_string(rank); }

  std::string dir_;
  std::vector<Rank> ranks_;
};

}  // namespace flotilla::parallel::testing
