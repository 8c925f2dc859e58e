// `flotilla info`: what this build supports and which devices it can see.
#pragma once

#include <CLI/CLI.hpp>

namespace flotilla::cli {

void AddInfoCommand(CLI::App& app);

}  // namespace flotilla::cli
