// `flotilla render`: the Harmony prompt for a conversation or an OpenAI
// chat-completions request, ready for the assistant's completion.
#pragma once

#include <CLI/CLI.hpp>

namespace flotilla::cli {

void AddRenderCommand(CLI::App& app);

}  // namespace flotilla::cli
