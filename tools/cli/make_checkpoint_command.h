// `flotilla make-checkpoint`: writes a synthetic gpt-oss checkpoint of any
// shape in the Hugging Face layout (deterministic from --seed).
#pragma once

#include <CLI/CLI.hpp>

namespace flotilla::cli {

void AddMakeCheckpointCommand(CLI::App& app);

}  // namespace flotilla::cli
