#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

namespace {

// Runs a shell command and returns {exit code, stdout}.
std::pair<int, std::string> RunCommand(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return {-1, ""};
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  int rc = pclose(p);
  return {WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, out};
}

TEST(FlotillaCli, InfoJsonDescribesBuildAndDevices) {
  auto [rc, out] = RunCommand(std::string(FLOTILLA_BIN) + " info --json");
  ASSERT_EQ(rc, 0) << out;
  nlohmann::json j = nlohmann::json::parse(out);
  EXPECT_EQ(j["build"]["version"], "0.1.0");
  EXPECT_TRUE(j["build"]["ucx"].is_boolean());
  ASSERT_GE(j["devices"].size(), 1u);
  EXPECT_EQ(j["devices"][0]["kind"], "CPU");
}

TEST(FlotillaCli, UnknownSubcommandFailsWithMessage) {
  auto [rc, out] = RunCommand(std::string(FLOTILLA_BIN) + " frobnicate 2>&1");
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("frobnicate"), std::string::npos) << out;
}

}  // namespace
