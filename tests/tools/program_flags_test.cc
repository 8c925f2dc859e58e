// Every program's command line as users type it: the readable errors (what
// was wrong, the nearest flag or command) and --config FILE, on the real
// binaries.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "tests/run_command.h"

namespace flotilla {
namespace {

using testing_util::RunCommandWithStderr;

std::string Bin(const std::string& program) { return std::string(FLOTILLA_BIN_DIR) + "/" + program; }

// {exit code, stdout and stderr} of `program args`.
std::pair<int, std::string> RunProgram(const std::string& program, const std::string& args) {
  return RunCommandWithStderr(Bin(program) + " " + args);
}

// `program ARGS` exits non-zero naming `want`; what it printed.
std::string ExpectRefused(const std::string& program, const std::string& args,
                          const std::string& want) {
  auto [rc, out] = RunProgram(program, args);
  EXPECT_NE(rc, 0) << program << " " << args;
  EXPECT_NE(out.find(want), std::string::npos) << program << " " << args << ": " << out;
  return out;
}

std::string ScratchFile(const std::string& name, const std::string& text) {
  const std::string path =
      ::testing::TempDir() + "/flotilla-flags-" + std::to_string(getpid()) + "-" + name;
  std::ofstream(path) << text;
  return path;
}

TEST(ProgramFlags, UnknownFlagsNameTheNearestOnEveryProgram) {
  for (const auto& [program, args, want] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"flotilla", "up --wokers 2", "unknown flag --wokers; did you mean --workers?"},
           {"flotilla", "--log-levl debug up", "did you mean --log-level?"},
           {"flotilla-coordinator", "--model synthetic:tiny --wokers 2",
            "unknown flag --wokers; did you mean --workers?"},
           {"flotilla-worker", "--coordinatr 127.0.0.1:1",
            "unknown flag --coordinatr; did you mean --coordinator?"},
           {"flotillactl", "--coordinatr 127.0.0.1:1 status",
            "unknown flag --coordinatr; did you mean --coordinator?"}}) {
    const std::string out = ExpectRefused(program, args, want);
    EXPECT_NE(out.find(program + ": "), std::string::npos) << out;
    EXPECT_EQ(out.find("were not expected"), std::string::npos) << out;
  }
}

TEST(ProgramFlags, UnknownCommandsNameTheNearest) {
  ExpectRefused("flotilla", "upp", "unknown command 'upp'; did you mean up?");
  const std::string out =
      ExpectRefused("flotillactl", "statuss", "unknown command 'statuss'; did you mean status?");
  EXPECT_EQ(out.find("A subcommand is required"), std::string::npos) << out;
}

TEST(ProgramFlags, CountsTakeSizesAndBadOnesSayWhy) {
  // 2k is a count; the range then refuses it by its value, not its spelling.
  ExpectRefused("flotilla", "up --workers 2k", "--workers: 2000 is out of range: 1 to 64");
  const std::string out =
      ExpectRefused("flotilla-coordinator", "--model synthetic:tiny --max-sequences lots",
                    "--max-sequences: 'lots' is not a number");
  EXPECT_LT(out.size(), 300u) << "no 310-digit range: " << out;
}

TEST(ProgramFlags, ConfigFileUnknownKeyIsAnErrorNamingIt) {
  const std::string file = ScratchFile("typo.yaml", "wokers: 2\n");
  for (const std::string program : {"flotilla-coordinator", "flotilla-worker", "flotillactl"}) {
    auto [rc, out] = RunProgram(program, "--config " + file);
    EXPECT_NE(rc, 0) << program;
    EXPECT_NE(out.find("--config: unknown key 'wokers'"), std::string::npos) << program << ": " << out;
  }
  auto [rc, out] = RunProgram("flotilla", "up --config " + file);
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("unknown key 'wokers'; did you mean workers?"), std::string::npos) << out;
  std::filesystem::remove(file);
}

TEST(ProgramFlags, ConfigFileStartsTheCoordinatorAndFlagsOverrideIt) {
  const std::string port_file = ScratchFile("port", "");
  std::filesystem::remove(port_file);
  // The file's listen address would be taken; the command line's wins.
  const std::string file = ScratchFile("coordinator.yaml",
                                       "model: synthetic:tiny\n"
                                       "workers: 1\n"
                                       "listen: 127.0.0.1:1\n"
                                       "http-listen: 127.0.0.1:0\n"
                                       "port-file: " + port_file + "\n");
  const std::string coordinator = Bin("flotilla-coordinator");
  const pid_t pid = fork();
  if (pid == 0) {
    execl(coordinator.c_str(), coordinator.c_str(), "--config", file.c_str(), "--listen",
          "127.0.0.1:0", "--log-level", "error", static_cast<char*>(nullptr));
    _exit(127);
  }
  ASSERT_GT(pid, 0);
  std::string port;
  for (int i = 0; i < 300 && port.empty(); ++i) {
    std::ifstream(port_file) >> port;
    if (port.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_FALSE(port.empty()) << "the coordinator never wrote the config file's --port-file";
  EXPECT_NE(port, "1");
  std::filesystem::remove(file);
  std::filesystem::remove(port_file);
}

}  // namespace
}  // namespace flotilla
