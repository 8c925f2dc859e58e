// `flotilla`: the user CLI. Each subcommand lives in its own *_command.cc.
#include <CLI/CLI.hpp>

#include <optional>
#include <string>

#include "common/command_line.h"
#include "common/config_file.h"
#include "common/logging.h"
#include "tools/cli/bench_command.h"
#include "tools/cli/chat_command.h"
#include "tools/cli/generate_command.h"
#include "tools/cli/info_command.h"
#include "tools/cli/make_checkpoint_command.h"
#include "tools/cli/parse_command.h"
#include "tools/cli/render_command.h"
#include "tools/cli/up_command.h"

int main(int argc, char** argv) {
  CLI::App app{"flotilla: serve gpt-oss across GPUs and nodes"};
  app.require_subcommand(1);
  // Logging flags work before or after the subcommand (flotilla up --log-level debug).
  app.fallthrough();
  flotilla::LogOptions log_options;
  flotilla::AddLogFlags(app, &log_options);
  flotilla::AddVersionFlag(app, "flotilla");
  app.parse_complete_callback([&log_options] {
    if (absl::Status st = flotilla::ConfigureLogging(log_options); !st.ok()) {
      throw CLI::ValidationError(std::string(st.message()));
    }
  });
  flotilla::cli::AddInfoCommand(app);
  flotilla::cli::AddMakeCheckpointCommand(app);
  flotilla::cli::AddGenerateCommand(app);
  flotilla::cli::AddRenderCommand(app);
  flotilla::cli::AddParseCommand(app);
  flotilla::cli::AddUpCommand(app);
  flotilla::cli::AddBenchCommand(app);
  flotilla::cli::AddChatCommand(app);
  flotilla::AddConfigFlag(app);
  if (std::optional<int> exit_code = flotilla::ParseCommandLine(app, argc, argv)) return *exit_code;
  return 0;
}
