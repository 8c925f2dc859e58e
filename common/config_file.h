// `--config FILE` for every program: a YAML mapping whose keys are the long
// flags without their dashes (`max-sequences: 256`, `served-model-name:
// [a, b]`, `prefix-cache: false`). A key of a subcommand's flag may sit at the
// top (for the subcommand on the command line) or under the subcommand's name
// (`up: {workers: 2}`). Flags given on the command line override the file;
// the file overrides FLOTILLA_* variables. An unknown key is an error naming
// it (command_line.h words it, with the nearest key).
#pragma once

#include <string>
#include <vector>

namespace CLI {
class App;
struct ConfigItem;
}

namespace flotilla {

// Adds --config FILE to `app` (the top-level app: CLI11 reads config files
// there only), read with YAML.
void AddConfigFlag(CLI::App& app);

// The items of YAML `text` for `app`: each key to its flag, with the
// subcommand it belongs to. Throws CLI::ConfigError (parse errors, nesting
// deeper than a subcommand) like CLI11's own readers.
std::vector<CLI::ConfigItem> ConfigItemsFromYaml(const CLI::App& app, const std::string& text);

}  // namespace flotilla
