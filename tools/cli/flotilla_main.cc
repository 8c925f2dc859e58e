// `flotilla`: the user CLI. Each subcommand lives in its own *_command.cc.
#include <CLI/CLI.hpp>

#include <iostream>
#include <string>

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
  // CLI11 reports an unknown first word only as "a subcommand is required";
  // name the word and the choices instead.
  bool known = false;
  for (const CLI::App* sub : app.get_subcommands({})) known |= argc > 1 && sub->check_name(argv[1]);
  if (argc > 1 && argv[1][0] != '-' && !known) {
    std::cerr << "flotilla: unknown command '" << argv[1] << "'; commands:";
    for (const CLI::App* sub : app.get_subcommands({})) std::cerr << " " << sub->get_name();
    std::cerr << "\n";
    return 2;
  }
  CLI11_PARSE(app, argc, argv);
  return 0;
}
