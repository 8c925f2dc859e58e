// `flotilla generate --model synthetic:PRESET[:SEED]` run as a user would: the
// same tokens as the checkpoint `flotilla make-checkpoint --preset PRESET
// --seed SEED` writes, and clear errors for bad specs.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/model/bad_synthetic_specs.h"
#include "tests/run_command.h"

namespace {

using flotilla::testing_util::RunCommand;

std::string Flotilla(const std::string& args) { return std::string(FLOTILLA_BIN) + " " + args; }

TEST(SyntheticModelCli, GeneratesTheTokensOfTheWrittenCheckpoint) {
  const std::string dir = (std::filesystem::temp_directory_path() /
                           ("flotilla_synthetic_cli_" + std::to_string(getpid())))
                              .string();
  auto [rc, out] =
      RunCommand(Flotilla("make-checkpoint --preset tiny --seed 7 --out " + dir + " 2>&1"));
  ASSERT_EQ(rc, 0) << out;
  for (const char* prompt : {"1,2,3", "500,17", "9,8,7,6,5,4,3,2,1,0,999"}) {
    SCOPED_TRACE(prompt);
    const std::string args = std::string(" --prompt-ids ") + prompt +
                             " --max-tokens 12 --temperature 0 --stop-token-ids '' --json 2>&1";
    auto [rc_dir, from_dir] = RunCommand(Flotilla("generate --model " + dir + args));
    auto [rc_spec, from_spec] = RunCommand(Flotilla("generate --model synthetic:tiny:7" + args));
    ASSERT_EQ(rc_dir, 0) << from_dir;
    ASSERT_EQ(rc_spec, 0) << from_spec;
    const nlohmann::json want = nlohmann::json::parse(from_dir);
    const nlohmann::json got = nlohmann::json::parse(from_spec);
    EXPECT_EQ(want["tokens"].size(), 12u);
    EXPECT_EQ(got["tokens"], want["tokens"]);
  }
  // Another seed is another model.
  auto [rc_other, other] = RunCommand(Flotilla(
      "generate --model synthetic:tiny:8 --prompt-ids 1,2,3 --max-tokens 12 --temperature 0 "
      "--stop-token-ids '' --json"));
  auto [rc_same, same] = RunCommand(Flotilla(
      "generate --model synthetic:tiny:7 --prompt-ids 1,2,3 --max-tokens 12 --temperature 0 "
      "--stop-token-ids '' --json"));
  ASSERT_EQ(rc_other, 0);
  EXPECT_NE(nlohmann::json::parse(other)["tokens"], nlohmann::json::parse(same)["tokens"]);
  std::filesystem::remove_all(dir);
}

TEST(SyntheticModelCli, BadSpecsFailWithTheProblemNamed) {
  for (const auto& c : flotilla::testing_util::kBadSyntheticSpecs) {
    auto [rc, out] = RunCommand(Flotilla(std::string("generate --model ") + c.spec +
                                         " --prompt-ids 1 --max-tokens 1 2>&1"));
    EXPECT_EQ(rc, 2) << out;
    EXPECT_NE(out.find(c.problem), std::string::npos) << out;
    EXPECT_NE(out.find(c.spec), std::string::npos) << out;
  }
}

}  // namespace
