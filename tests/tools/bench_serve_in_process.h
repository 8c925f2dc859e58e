// Runs `flotilla bench serve ARGS` inside a test process and reads back the
// JSON lines it prints, for the bench's own tests.
#pragma once

#include <gtest/gtest.h>

#include <CLI/CLI.hpp>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "tools/cli/bench_command.h"

namespace flotilla::cli {

// Its stdout lines as JSON; `*ok` false when the flags were refused.
inline std::vector<nlohmann::json> BenchServe(const std::string& args, bool* ok) {
  CLI::App app;
  AddBenchCommand(app);
  std::stringstream out;
  std::streambuf* saved = std::cout.rdbuf(out.rdbuf());
  *ok = true;
  try {
    app.parse("bench serve " + args, /*program_name_included=*/false);
  } catch (const CLI::Error& e) {
    *ok = false;
    std::cerr << "bench serve: " << e.what() << "\n";
  }
  std::cout.rdbuf(saved);
  std::vector<nlohmann::json> lines;
  std::string line;
  while (std::getline(out, line)) {
    if (!line.empty()) lines.push_back(nlohmann::json::parse(line));
  }
  return lines;
}

// The one JSON line of a run that prints one (a run without --rate-fraction);
// an empty object, and a test failure, when the flags were refused or it
// printed otherwise.
inline nlohmann::json BenchServeLine(const std::string& args) {
  bool ok = false;
  const std::vector<nlohmann::json> lines = BenchServe(args, &ok);
  EXPECT_TRUE(ok) << "bench serve " << args;
  EXPECT_EQ(lines.size(), 1u) << "bench serve " << args;
  return ok && lines.size() == 1 ? lines[0] : nlohmann::json::object();
}

}  // namespace flotilla::cli
