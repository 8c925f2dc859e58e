// `flotilla generate` end to end: a synthetic checkpoint written by
// `flotilla make-checkpoint`, then the binary run as a user would.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/run_command.h"

namespace {

using flotilla::testing_util::RunCommand;

class GenerateCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string((std::filesystem::temp_directory_path() /
                            ("flotilla_generate_cli_" + std::to_string(getpid())))
                               .string());
    auto [rc, out] = RunCommand(std::string(FLOTILLA_BIN) + " make-checkpoint --out " + *dir_ +
                                "/model --seed 7 2>&1");
    ASSERT_EQ(rc, 0) << out;
  }
  static void TearDownTestSuite() {
    std::filesystem::remove_all(*dir_);
    delete dir_;
  }
  static std::string Generate(const std::string& args) {
    return std::string(FLOTILLA_BIN) + " generate --model " + *dir_ + "/model " + args;
  }
  static std::string* dir_;
};
std::string* GenerateCli::dir_ = nullptr;

TEST_F(GenerateCli, PrintsOneJsonObjectWithTokensAndUsage) {
  auto [rc, out] = RunCommand(Generate("--prompt-ids 1,2,3 --max-tokens 6 --temperature 0 --json"));
  ASSERT_EQ(rc, 0) << out;
  nlohmann::json j = nlohmann::json::parse(out);
  ASSERT_EQ(j["tokens"].size(), 6u);
  EXPECT_EQ(j["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["prompt_tokens"], 3);
  EXPECT_EQ(j["usage"]["completion_tokens"], 6);
  EXPECT_FALSE(j.contains("logprobs"));
  // Greedy is deterministic.
  auto [rc2, out2] = RunCommand(Generate("--prompt-ids 1,2,3 --max-tokens 6 --temperature 0 --json"));
  EXPECT_EQ(nlohmann::json::parse(out2)["tokens"], j["tokens"]);
}

TEST_F(GenerateCli, SeedMakesSamplingReproducible) {
  const std::string args = "--prompt-ids 5,6 --max-tokens 10 --temperature 1.3 --top-k 100 "
                           "--stop-token-ids '' --json --seed ";
  auto a = nlohmann::json::parse(RunCommand(Generate(args + "11")).second);
  auto b = nlohmann::json::parse(RunCommand(Generate(args + "11")).second);
  auto c = nlohmann::json::parse(RunCommand(Generate(args + "12")).second);
  EXPECT_EQ(a["tokens"], b["tokens"]);
  EXPECT_NE(a["tokens"], c["tokens"]);
}

TEST_F(GenerateCli, LogitsOutAndLogprobsAgree) {
  const std::string file = *dir_ + "/logits.json";
  auto [rc, out] = RunCommand(Generate("--prompt-ids 9,8,7,6 --max-tokens 2 --temperature 0 "
                                       "--logprobs 3 --json --logits-out " + file));
  ASSERT_EQ(rc, 0) << out;
  nlohmann::json j = nlohmann::json::parse(out);
  std::ifstream in(file);
  nlohmann::json logits = nlohmann::json::parse(in);
  ASSERT_EQ(logits.size(), 4u);
  const size_t V = logits[0].size();
  ASSERT_GT(V, 100u);
  // The first generated token is the argmax of the last prompt row, and its
  // logprob is that row's log-softmax.
  const auto& last = logits[3];
  size_t best = 0;
  double z = 0, mx = last[0];
  for (size_t v = 0; v < V; ++v) mx = std::max(mx, last[v].get<double>());
  for (size_t v = 0; v < V; ++v) {
    if (last[v].get<double>() > last[best].get<double>()) best = v;
    z += std::exp(last[v].get<double>() - mx);
  }
  EXPECT_EQ(j["tokens"][0], best);
  ASSERT_EQ(j["logprobs"].size(), 2u);
  EXPECT_NEAR(j["logprobs"][0]["logprob"].get<double>(), last[best].get<double>() - mx - std::log(z), 1e-4);
  EXPECT_EQ(j["logprobs"][0]["top_logprobs"].size(), 3u);
  EXPECT_EQ(j["logprobs"][0]["top_logprobs"][0]["token"], best);
}

TEST_F(GenerateCli, BadInputGetsAClearMessageAndNonZeroExit) {
  auto check = [](const std::string& cmd, const std::string& words) {
    auto [rc, out] = RunCommand(cmd + " 2>&1");
    EXPECT_NE(rc, 0) << cmd;
    EXPECT_NE(out.find(words), std::string::npos) << cmd << "\n" << out;
  };
  check(Generate("--prompt-ids 1,x"), "'x' is not an integer");
  check(Generate("--prompt-ids 1,100000"), "token id 100000 at index 1 is out of range");
  check(Generate("--prompt-ids 1 --top-p 1.5"), "top_p");
  check(Generate("--prompt-ids 1 --logprobs 50"), "top_logprobs");
  check(Generate("--prompt-ids 1 --max-tokens 0"), "max_tokens");
  check(std::string(FLOTILLA_BIN) + " generate --model /nonexistent/dir --prompt-ids 1",
        "/nonexistent/dir");
  check(std::string(FLOTILLA_BIN) + " generate --prompt-ids 1", "--model");
  check(Generate("--prompt-ids 1 --temperature hot"), "temperature");
}

// The CLI's greedy output on each golden fixture equals transformers' greedy
// continuation (stop tokens off: the fixtures never stop on eos).
TEST(GenerateCliGolden, GreedyMatchesTransformersOnEveryFixture) {
  int fixtures = 0;
  for (const auto& entry : std::filesystem::directory_iterator(FLOTILLA_GOLDEN_DIR)) {
    if (!std::filesystem::exists(entry.path() / "golden.json")) continue;
    ++fixtures;
    std::ifstream in(entry.path() / "golden.json");
    nlohmann::json g = nlohmann::json::parse(in);
    for (size_t i = 0; i < g["prompts"].size(); ++i) {
      std::string ids;
      for (const auto& t : g["prompts"][i]) {
        if (!ids.empty()) ids.push_back(',');
        ids.append(std::to_string(t.get<int>()));
      }
      auto [rc, out] = RunCommand(std::string(FLOTILLA_BIN) + " generate --model " +
                                  entry.path().string() + " --prompt-ids " + ids +
                                  " --temperature 0 --max-tokens 24 --stop-token-ids '' --json");
      ASSERT_EQ(rc, 0) << out;
      EXPECT_EQ(nlohmann::json::parse(out)["tokens"], g["greedy"][i])
          << entry.path().filename() << " prompt " << i;
    }
  }
  EXPECT_GT(fixtures, 0);
}

}  // namespace
