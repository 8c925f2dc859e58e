// `flotilla bench soak`: a bounded mix of streams, cancels, malformed requests
// and periodic worker kills against a cluster (one it starts, or a running
// one); prints JSON lines with lost / hung / failed counts and the
// coordinator's memory and descriptor growth.
#pragma once

#include <CLI/CLI.hpp>

namespace flotilla::cli {

// Adds `soak` under the `bench` subcommand.
void AddSoakCommand(CLI::App& bench);

}  // namespace flotilla::cli
