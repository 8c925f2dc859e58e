// `flotilla bench serve`'s load shapes: token ranges as --prompt-tokens and
// --output-tokens take them, and --rate-fraction against a real CPU cluster
// (a coordinator and a worker process): the capacity line, then one line per
// fraction at that share of it, every request answered within its ranges.
#include <gtest/gtest.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "tests/cluster_options.h"
#include "tests/tools/bench_serve_in_process.h"
#include "tools/cli/bench_command.h"
#include "tools/cli/local_cluster.h"
#include "tools/cli/serve_load.h"

namespace flotilla {
namespace {

using cli::BenchServe;

TEST(BenchServeTokenRange, TakesNOrMinMax) {
  EXPECT_EQ(*cli::ParseTokenRange("512"), (std::pair<int, int>{512, 512}));
  EXPECT_EQ(*cli::ParseTokenRange("256-2048"), (std::pair<int, int>{256, 2048}));
  for (const char* bad : {"", "0", "2048-256", "1-2-3", "a-9", "-5", "5-", "1-2000000"}) {
    absl::StatusOr<std::pair<int, int>> r = cli::ParseTokenRange(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(std::string("\"") + bad + "\""), std::string::npos)
        << r.status();
  }
}

// Chat replies must end, so flags that run answers to a length are refused,
// naming the flag the user gave (--output-tokens implies --ignore-eos) and,
// for it, what bounds a chat answer instead.
TEST(BenchServeChat, RefusesRunToLengthFlagsNamingTheOneGiven) {
  auto refusal = [](const std::string& args) {
    std::stringstream err;
    std::streambuf* saved = std::cerr.rdbuf(err.rdbuf());
    bool ok = true;
    BenchServe(args + " --coordinator 127.0.0.1:1 --duration 1", &ok);
    std::cerr.rdbuf(saved);
    EXPECT_FALSE(ok) << args;
    return err.str();
  };
  const std::string tokens = refusal("--chat --output-tokens 85");
  EXPECT_NE(tokens.find("--output-tokens"), std::string::npos) << tokens;
  EXPECT_NE(tokens.find("--output-len MIN MAX"), std::string::npos) << tokens;
  EXPECT_EQ(tokens.find("--ignore-eos"), std::string::npos) << tokens;
  const std::string eos = refusal("--chat --ignore-eos --output-len 8 8");
  EXPECT_NE(eos.find("--ignore-eos"), std::string::npos) << eos;
  const std::string turns = refusal("--chat --multi-turn 2");
  EXPECT_NE(turns.find("--multi-turn"), std::string::npos) << turns;
}

// --tools reads an OpenAI "tools" array into the functions every Chat
// request offers; anything else is refused naming the file.
TEST(BenchServeTools, ReadsAnOpenAiToolsArray) {
  const std::string path = ::testing::TempDir() + "/bench_tools_" + std::to_string(getpid());
  auto write = [&](const std::string& text) { std::ofstream(path) << text; };
  write(R"([{"type": "function", "function": {"name": "add", "description": "Adds.",
      "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}},
      {"type": "function", "function": {"name": "now", "strict": true}}])");
  absl::StatusOr<std::vector<v1::Tool>> tools = cli::ReadBenchTools(path);
  ASSERT_TRUE(tools.ok()) << tools.status();
  ASSERT_EQ(tools->size(), 2u);
  EXPECT_EQ((*tools)[0].name(), "add");
  EXPECT_EQ((*tools)[0].description(), "Adds.");
  EXPECT_EQ(nlohmann::json::parse((*tools)[0].parameters_json())["properties"]["a"]["type"],
            "integer");
  EXPECT_EQ((*tools)[1].name(), "now");
  EXPECT_TRUE((*tools)[1].strict());
  EXPECT_EQ((*tools)[1].parameters_json(), "");
  for (const char* bad : {"", "{}", "[]", "[1]", R"([{"type": "function"}])",
                          R"([{"type": "web", "function": {"name": "x"}}])",
                          R"([{"type": "function", "function": {"name": 3}}])"}) {
    write(bad);
    absl::StatusOr<std::vector<v1::Tool>> r = cli::ReadBenchTools(path);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(r.status().message().find(path), std::string::npos) << r.status();
  }
  std::filesystem::remove(path);
  EXPECT_EQ(cli::ReadBenchTools(path).status().code(), absl::StatusCode::kNotFound);
}

TEST(BenchServeRateFraction, MeasuresTheCapacityThenRunsEachFractionOfIt) {
  auto cluster =
      cli::LocalCluster::Start(testing_util::TestClusterOptions("", 1, 0, "bench-serve-test"));
  ASSERT_TRUE(cluster.ok()) << cluster.status();

  bool ok = false;
  const std::vector<nlohmann::json> lines = BenchServe(
      "--coordinator " + (*cluster)->address() +
          " --concurrency 4 --duration 1.5 --prompt-tokens 8-48 --output-tokens 2-10"
          " --rate-fraction 0.5,0.9 --seed 7 --engine-compare off",
      &ok);
  ASSERT_TRUE(ok);
  ASSERT_EQ(lines.size(), 3u);
  const nlohmann::json& capacity = lines[0];
  EXPECT_EQ(capacity["mode"], "capacity") << capacity.dump();
  EXPECT_EQ(capacity["requests_failed"].get<int>(), 0) << capacity.dump();
  const double capacity_rps = capacity["capacity_rps"].get<double>();
  EXPECT_GT(capacity_rps, 0) << capacity.dump();
  EXPECT_GT(capacity["capacity_output_tokens_per_s"].get<double>(), 0) << capacity.dump();
  const double fractions[] = {0.5, 0.9};
  for (int i = 0; i < 2; ++i) {
    const nlohmann::json& j = lines[i + 1];
    SCOPED_TRACE(j.dump());
    EXPECT_EQ(j["mode"], "rate");
    EXPECT_DOUBLE_EQ(j["rate_fraction"].get<double>(), fractions[i]);
    EXPECT_DOUBLE_EQ(j["capacity_rps"].get<double>(), capacity_rps);
    EXPECT_DOUBLE_EQ(j["rate_rps"].get<double>(), fractions[i] * capacity_rps);
    EXPECT_EQ(j["prompt_len"], (std::vector<int>{8, 48}));
    EXPECT_EQ(j["output_len"], (std::vector<int>{2, 10}));
    EXPECT_EQ(j["requests_failed"].get<int>(), 0);
    EXPECT_EQ(j["requests_unaccounted"].get<int>(), 0);
    const int answered = j["requests_ok"].get<int>();
    ASSERT_GT(answered, 0);
    // Every request runs to its drawn length (end tokens ignored): 2 to 10 tokens.
    EXPECT_GE(j["output_tokens"].get<int>(), 2 * answered);
    EXPECT_LE(j["output_tokens"].get<int>(), 10 * answered);
    EXPECT_EQ(j["ttft_ms"]["n"].get<int>(), answered);
    for (const char* p : {"p50", "p90", "p99"}) EXPECT_GT(j["ttft_ms"][p].get<double>(), 0);
    EXPECT_TRUE(j["itl_ms"].contains("p50"));
    EXPECT_GT(j["output_tokens_per_s"].get<double>(), 0);
  }
  EXPECT_TRUE((*cluster)->CheckAlive().ok());

  // A reversed range is refused before any load.
  const std::vector<nlohmann::json> none =
      BenchServe("--coordinator " + (*cluster)->address() + " --prompt-tokens 64-16", &ok);
  EXPECT_FALSE(ok);
  EXPECT_TRUE(none.empty());
}

}  // namespace
}  // namespace flotilla
