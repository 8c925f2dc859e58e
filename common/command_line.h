// Command-line parsing shared by every program (flotilla, flotilla-coordinator,
// flotilla-worker, flotillactl): CLI11 underneath, with errors a person can
// act on (what was wrong, the nearest flag or command by edit distance)
// instead of CLI11's raw messages, and counts written as sizes (2k).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace CLI {
class App;
}

namespace flotilla {

// Parses `argv` into `app` (and runs its callbacks) like CLI11_PARSE. Returns
// the exit code when parsing ended the program (--help, --version, an error,
// printed as "PROGRAM: MESSAGE" on stderr), nullopt to go on. Call it after
// every option is declared: it also makes every integer option accept sizes
// (AcceptSizeSuffixes).
std::optional<int> ParseCommandLine(CLI::App& app, int argc, char** argv);

// Every integer option of `app` and its subcommands also takes a count
// written with a suffix: k, m, g (x1000), Ki, Mi, Gi (x1024): 2k = 2000.
void AcceptSizeSuffixes(CLI::App& app);

// Every option of `app` (not its subcommands') without an environment
// variable gets FLOTILLA_ and its last long name, upper-cased with dashes as
// underscores (--max-num-batched-tokens,--max-batch-tokens:
// FLOTILLA_MAX_BATCH_TOKENS); --help, --version and --config get none. Call
// it once every option is declared: each knob then names its variable once,
// by its flag.
void NameEnvironmentVariables(CLI::App& app);

// "2k" -> "2000", "1Ki" -> "1024", "12" -> "12"; nullopt when `text` is not a
// whole number with an optional suffix.
std::optional<std::string> ExpandSizeSuffix(std::string_view text);

// The candidate nearest `word` by edit distance, when it is near enough to be
// a likely typo (at most 2 edits, or a third of the word); else "".
std::string Nearest(std::string_view word, const std::vector<std::string>& candidates);

// The readable message for CLI11's error `message` (its what()) of error kind
// `kind` (its class: "ExtrasError", "ValidationError", ...), raised while
// parsing `args` (argv without the program) into `app`.
std::string ReadableError(const CLI::App& app, const std::vector<std::string>& args,
                          std::string_view kind, std::string_view message);

}  // namespace flotilla
