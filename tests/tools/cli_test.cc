#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>

#include "tests/run_command.h"

namespace {

// Runs a shell command and returns {exit code, stdout}.
using flotilla::testing_util::RunCommand;

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

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

std::string ScratchDir(const std::string& name) {
  std::string dir = ::testing::TempDir() + "/flotilla_cli_" + name;
  std::filesystem::remove_all(dir);
  return dir;
}

TEST(FlotillaCli, MakeCheckpointWritesTheShardedLayout) {
  const std::string dir = ScratchDir("sharded");
  auto [rc, out] = RunCommand(std::string(FLOTILLA_BIN) + " make-checkpoint --out " + dir +
                              " --shards 2 --seed 3 --set num_hidden_layers=2 2>&1");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("in 2 file(s)"), std::string::npos) << out;
  EXPECT_TRUE(std::filesystem::exists(dir + "/model-00001-of-00002.safetensors"));
  EXPECT_TRUE(std::filesystem::exists(dir + "/model-00002-of-00002.safetensors"));
  nlohmann::json index = nlohmann::json::parse(ReadFile(dir + "/model.safetensors.index.json"));
  EXPECT_EQ(index["weight_map"].size(), 3u + 19u * 2u);
  nlohmann::json config = nlohmann::json::parse(ReadFile(dir + "/config.json"));
  EXPECT_EQ(config["num_hidden_layers"], 2);
  EXPECT_EQ(config["layer_types"].size(), 2u);
}

// The committed golden fixture is exactly what the writer produces from the
// arguments tools/golden/make_goldens.sh gives it.
TEST(FlotillaCli, MakeCheckpointReproducesTheGoldenFixture) {
  const std::string dir = ScratchDir("tiny_e8");
  auto [rc, out] = RunCommand(std::string(FLOTILLA_BIN) + " make-checkpoint --out " + dir +
                              " --seed 1 --set max_position_embeddings=131072 --set vocab_size=512"
                              " --set eos_token_id=510 --set pad_token_id=511 2>&1");
  ASSERT_EQ(rc, 0) << out;
  const std::string want = ReadFile("tests/data/golden/tiny_e8/model.safetensors");
  ASSERT_FALSE(want.empty());
  EXPECT_TRUE(ReadFile(dir + "/model.safetensors") == want);
  EXPECT_EQ(ReadFile(dir + "/config.json"), ReadFile("tests/data/golden/tiny_e8/config.json"));
}

TEST(FlotillaCli, MakeCheckpointRejectsBadArguments) {
  const std::string dir = ScratchDir("bad");
  auto [rc, out] = RunCommand(std::string(FLOTILLA_BIN) + " make-checkpoint --out " + dir +
                              " --set head_dim=7 2>&1");
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("head_dim must be even"), std::string::npos) << out;
  std::tie(rc, out) = RunCommand(std::string(FLOTILLA_BIN) + " make-checkpoint --out " + dir +
                                 " --preset 7b 2>&1");
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("7b"), std::string::npos) << out;
  std::tie(rc, out) = RunCommand(std::string(FLOTILLA_BIN) + " make-checkpoint --out " + dir +
                                 " --shards 500 2>&1");
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("shards must be in"), std::string::npos) << out;
  std::tie(rc, out) = RunCommand(std::string(FLOTILLA_BIN) + " make-checkpoint 2>&1");
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("--out"), std::string::npos) << out;
}

}  // namespace
