// `flotilla generate`: runs one request in-process on the CPU engine and
// prints the generated token ids (one JSON object with --json).
#pragma once

#include <CLI/CLI.hpp>

namespace flotilla::cli {

void AddGenerateCommand(CLI::App& app);

}  // namespace flotilla::cli
