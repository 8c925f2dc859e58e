// Helpers shared by the Harmony subcommands of `flotilla`.
#pragma once

#include <CLI/CLI.hpp>
#include <iostream>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/tokenizer/tokenizer.h"

namespace flotilla::cli {

// Prints "flotilla CMD: MESSAGE" and makes the program exit with status 1.
[[noreturn]] inline void FailCommand(const std::string& cmd, const absl::Status& status) {
  std::cerr << "flotilla " << cmd << ": " << status.message() << "\n";
  throw CLI::RuntimeError(1);
}

// Reads a whole file; NotFound naming it when it cannot be read.
absl::StatusOr<std::string> ReadFile(const std::string& path);

// Loads the tokenizer from `path`, or from the default location when empty.
absl::StatusOr<std::unique_ptr<tokenizer::Tokenizer>> LoadTokenizer(const std::string& path);

// Adds `--tokenizer FILE` to `cmd`, read into `path` (LoadTokenizer's `path`).
inline void AddTokenizerOption(CLI::App* cmd, std::string* path) {
  cmd->add_option("--tokenizer", *path,
                  "o200k ranks file (default: o200k_base.ranks beside the binary or "
                  "share/flotilla/ above it)");
}

}  // namespace flotilla::cli
