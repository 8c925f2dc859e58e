// `flotilla bench serve`: a load generator on the client SDK.
#pragma once

#include <CLI/CLI.hpp>

namespace flotilla::cli {

void AddBenchCommand(CLI::App& app);

}  // namespace flotilla::cli
