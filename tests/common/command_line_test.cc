// Command-line parsing of every program (common/command_line.h,
// common/config_file.h) on an app shaped like `flotilla`: top-level flags
// that fall through, subcommands with counts and ranges.
#include <gtest/gtest.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "common/command_line.h"
#include "common/config_file.h"

namespace flotilla {
namespace {

struct Flags {
  std::string log_level = "info";
  int workers = 1;
  uint32_t max_sequences = 256;
  std::vector<std::string> names;
  bool prefix_cache = true;
  std::string coordinator = "127.0.0.1:50051";
};

// Like flotilla: --log-level on top (falls through), `up` and `status`.
class Cli {
 public:
  Cli() {
    app_.require_subcommand(1);
    app_.fallthrough();
    app_.add_option("--log-level", flags.log_level, "level");
    CLI::App* up = app_.add_subcommand("up", "serve");
    up->add_option("--workers", flags.workers, "workers")->check(CLI::Range(1, 64));
    up->add_option("--max-sequences", flags.max_sequences, "sequences")
        ->check(CLI::PositiveNumber);
    up->add_option("--served-model-name", flags.names, "names")->delimiter(',');
    up->add_flag("--prefix-cache,!--no-prefix-cache", flags.prefix_cache, "cache");
    CLI::App* status = app_.add_subcommand("status", "status");
    status->add_option("--coordinator", flags.coordinator, "address");
    AddConfigFlag(app_);
    AcceptSizeSuffixes(app_);
  }

  // "" when `args` parse; else the readable error.
  std::string Parse(std::vector<std::string> args) {
    args_ = args;
    args.insert(args.begin(), "flotilla");
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    try {
      app_.parse(static_cast<int>(argv.size()), argv.data());
      return "";
    } catch (const CLI::ExtrasError& e) {
      return ReadableError(app_, args_, "ExtrasError", e.what());
    } catch (const CLI::RequiredError& e) {
      return ReadableError(app_, args_, "RequiredError", e.what());
    } catch (const CLI::ConfigError& e) {
      return ReadableError(app_, args_, "ConfigError", e.what());
    } catch (const CLI::ParseError& e) {
      return ReadableError(app_, args_, e.get_name(), e.what());
    }
  }

  Flags flags;

 private:
  CLI::App app_{"test"};
  std::vector<std::string> args_;
};

std::string WriteFile(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "/" + name + "-" + std::to_string(getpid());
  std::ofstream(path) << text;
  return path;
}

TEST(CommandLine, NearestIsTheCloseTypoOnly) {
  const std::vector<std::string> flags = {"--workers", "--max-sequences", "--model"};
  EXPECT_EQ(Nearest("--wokers", flags), "--workers");
  EXPECT_EQ(Nearest("--max-sequence", flags), "--max-sequences");
  EXPECT_EQ(Nearest("--frobnicate", flags), "");
}

TEST(CommandLine, SizeSuffixesExpandToWholeCounts) {
  EXPECT_EQ(ExpandSizeSuffix("12"), "12");
  EXPECT_EQ(ExpandSizeSuffix("2k"), "2000");
  EXPECT_EQ(ExpandSizeSuffix("2K"), "2000");
  EXPECT_EQ(ExpandSizeSuffix("1Ki"), "1024");
  EXPECT_EQ(ExpandSizeSuffix("1.5k"), "1500");
  EXPECT_EQ(ExpandSizeSuffix("3M"), "3000000");
  EXPECT_EQ(ExpandSizeSuffix("2Gi"), "2147483648");
  EXPECT_EQ(ExpandSizeSuffix("1.0001k"), std::nullopt);  // not a whole count
  EXPECT_EQ(ExpandSizeSuffix("1.5"), std::nullopt);
  EXPECT_EQ(ExpandSizeSuffix("k"), std::nullopt);
  EXPECT_EQ(ExpandSizeSuffix("-2k"), std::nullopt);
  EXPECT_EQ(ExpandSizeSuffix("99999999999999999999k"), std::nullopt);
}

TEST(CommandLine, CountsTakeSizes) {
  Cli cli;
  EXPECT_EQ(cli.Parse({"up", "--max-sequences", "1k", "--workers", "8"}), "");
  EXPECT_EQ(cli.flags.max_sequences, 1000u);
  EXPECT_EQ(cli.flags.workers, 8);
}

// A knob's variable is named by its flag's last long name; one named
// already keeps its name, and the program's own flags get none.
TEST(CommandLine, EnvironmentVariablesAreNamedByTheFlag) {
  CLI::App app("test");
  app.set_version_flag("--version", "1");
  int batch = 0, other = 0;
  bool shared = false;
  std::string file;
  app.add_option("--max-num-batched-tokens,--max-batch-tokens", batch);
  app.add_flag("--shared-prefix-cache", shared);
  app.add_option("--key-file", file)->envname("FLOTILLA_OWN_NAME");
  app.add_option("-o", other);
  NameEnvironmentVariables(app);
  EXPECT_EQ(app.get_option("--max-batch-tokens")->get_envname(), "FLOTILLA_MAX_BATCH_TOKENS");
  EXPECT_EQ(app.get_option("--shared-prefix-cache")->get_envname(), "FLOTILLA_SHARED_PREFIX_CACHE");
  EXPECT_EQ(app.get_option("--key-file")->get_envname(), "FLOTILLA_OWN_NAME");
  EXPECT_EQ(app.get_option("-o")->get_envname(), "");
  EXPECT_EQ(app.get_option("--help")->get_envname(), "");
  EXPECT_EQ(app.get_option("--version")->get_envname(), "");
  setenv("FLOTILLA_MAX_BATCH_TOKENS", "4096", 1);
  setenv("FLOTILLA_SHARED_PREFIX_CACHE", "1", 1);
  std::vector<std::string> no_arguments;
  app.parse(no_arguments);
  unsetenv("FLOTILLA_MAX_BATCH_TOKENS");
  unsetenv("FLOTILLA_SHARED_PREFIX_CACHE");
  EXPECT_EQ(batch, 4096);
  EXPECT_TRUE(shared);
}

TEST(CommandLine, BadNumbersSayWhatIsWrongWithoutHugeRanges) {
  EXPECT_EQ(Cli().Parse({"up", "--max-sequences", "lots"}),
            "--max-sequences: 'lots' is not a number (counts may carry a suffix: 2k = 2000, "
            "1Ki = 1024)");
  EXPECT_EQ(Cli().Parse({"up", "--max-sequences", "0"}), "--max-sequences: 0 must be greater than 0");
  EXPECT_EQ(Cli().Parse({"up", "--workers", "1k"}), "--workers: 1000 is out of range: 1 to 64");
}

TEST(CommandLine, UnknownFlagSuggestsTheNearest) {
  EXPECT_EQ(Cli().Parse({"up", "--wokers", "2"}),
            "unknown flag --wokers; did you mean --workers? (see --help)");
  EXPECT_EQ(Cli().Parse({"--log-levl", "debug", "up"}),
            "unknown flag --log-levl; did you mean --log-level? (see --help)");
  EXPECT_EQ(Cli().Parse({"up", "--frobnicate"}), "unknown flag --frobnicate (see --help)");
}

TEST(CommandLine, UnknownCommandSuggestsTheNearest) {
  EXPECT_EQ(Cli().Parse({"upp"}), "unknown command 'upp'; did you mean up? (commands: up, status)");
  EXPECT_EQ(Cli().Parse({"--log-level", "debug", "stauts"}),
            "unknown command 'stauts'; did you mean status? (commands: up, status)");
  EXPECT_EQ(Cli().Parse({}), "give a command: up, status");
}

TEST(ConfigFile, KeysAreTheLongFlagsAndTheCommandLineWins) {
  const std::string file = WriteFile("up.yaml",
                                     "log-level: debug\n"
                                     "workers: 4\n"
                                     "max-sequences: 2k\n"
                                     "served-model-name: [a, b]\n"
                                     "prefix-cache: false\n");
  Cli cli;
  EXPECT_EQ(cli.Parse({"up", "--config", file, "--workers", "2"}), "");
  EXPECT_EQ(cli.flags.log_level, "debug");
  EXPECT_EQ(cli.flags.workers, 2);  // the command line overrides the file
  EXPECT_EQ(cli.flags.max_sequences, 2000u);
  EXPECT_EQ(cli.flags.names, (std::vector<std::string>{"a", "b"}));
  EXPECT_FALSE(cli.flags.prefix_cache);
  std::remove(file.c_str());
}

TEST(ConfigFile, SubcommandSectionsAndValuesAreChecked) {
  const std::string file = WriteFile("section.yaml", "up:\n  workers: 3\n");
  Cli cli;
  EXPECT_EQ(cli.Parse({"--config", file, "up"}), "");
  EXPECT_EQ(cli.flags.workers, 3);
  const std::string bad = WriteFile("bad.yaml", "workers: 100\n");
  EXPECT_EQ(Cli().Parse({"up", "--config", bad}), "--workers: 100 is out of range: 1 to 64");
  std::remove(file.c_str());
  std::remove(bad.c_str());
}

TEST(ConfigFile, UnknownKeysAreErrorsNamingTheKey) {
  const std::string file = WriteFile("typo.yaml", "wokers: 2\n");
  EXPECT_EQ(Cli().Parse({"up", "--config", file}),
            "--config: unknown key 'wokers'; did you mean workers? (keys are the long flags "
            "without --)");
  // A key of another subcommand is unknown to this one.
  const std::string other = WriteFile("other.yaml", "coordinator: x:1\n");
  EXPECT_NE(Cli().Parse({"up", "--config", other}).find("unknown key 'coordinator'"),
            std::string::npos);
  std::remove(file.c_str());
  std::remove(other.c_str());
}

TEST(ConfigFile, MalformedFilesAreClearErrors) {
  const std::string list = WriteFile("list.yaml", "- workers\n");
  EXPECT_EQ(Cli().Parse({"up", "--config", list}),
            "--config: the file must be a mapping of flag: value");
  const std::string broken = WriteFile("broken.yaml", "workers: [1\n");
  EXPECT_NE(Cli().Parse({"up", "--config", broken}).find("--config: not YAML"), std::string::npos);
  const std::string nested = WriteFile("nested.yaml", "workers: {a: 1}\n");
  EXPECT_NE(Cli().Parse({"up", "--config", nested}).find("unknown key"), std::string::npos);
  EXPECT_NE(Cli().Parse({"up", "--config", "/nonexistent/flotilla.yaml"}).find("flotilla.yaml"),
            std::string::npos);
  for (const std::string& f : {list, broken, nested}) std::remove(f.c_str());
}

}  // namespace
}  // namespace flotilla
