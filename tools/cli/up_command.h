// `flotilla up`: a whole local cluster in one command (coordinator + workers).
#pragma once

#include <CLI/CLI.hpp>

namespace flotilla::cli {

void AddUpCommand(CLI::App& app);

}  // namespace flotilla::cli
