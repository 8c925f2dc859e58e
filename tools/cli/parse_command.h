// `flotilla parse`: Harmony completion tokens -> messages (JSON).
#pragma once

#include <CLI/CLI.hpp>

namespace flotilla::cli {

void AddParseCommand(CLI::App& app);

}  // namespace flotilla::cli
