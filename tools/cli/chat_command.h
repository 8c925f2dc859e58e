// `flotilla chat`: a conversation with a running cluster through the client
// SDK's Chat call. Interactive (user turns from stdin; the conversation is
// kept) or one shot with --prompt. Reasoning and answer stream distinctly:
// reasoning dimmed on a terminal, lines labelled `reasoning:` / `answer:`
// otherwise.
#pragma once

#include <CLI/CLI.hpp>

namespace flotilla::cli {

void AddChatCommand(CLI::App& app);

}  // namespace flotilla::cli
