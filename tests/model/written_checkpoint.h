// The tiny preset's synthetic checkpoint as `flotilla make-checkpoint`
// writes it, on disk for the life of the object: what tests compare the
// engines that generate their weights from a spec against.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include "tools/checkpoint/synthetic_checkpoint.h"
#include "worker/model/checkpoint.h"

namespace flotilla::testing_util {

class WrittenTinyCheckpoint {
 public:
  // Writes the checkpoint of `seed` into `name`-PID under the temporary
  // directory and opens it; checkpoint() is null (with a test failure
  // saying why) when either fails.
  WrittenTinyCheckpoint(const std::string& name, uint64_t seed)
      : dir_((std::filesystem::temp_directory_path() / (name + "-" + std::to_string(getpid())))
                 .string()) {
    SyntheticCheckpointOptions o;
    o.seed = seed;
    const absl::Status written =
        WriteSyntheticCheckpoint(*MakeSyntheticConfig("tiny", "", {}), o, dir_);
    EXPECT_TRUE(written.ok()) << written;
    if (!written.ok()) return;
    absl::StatusOr<std::unique_ptr<Checkpoint>> opened = Checkpoint::Open(dir_);
    EXPECT_TRUE(opened.ok()) << opened.status();
    if (opened.ok()) checkpoint_ = std::move(*opened);
  }
  ~WrittenTinyCheckpoint() { std::filesystem::remove_all(dir_); }
  WrittenTinyCheckpoint(const WrittenTinyCheckpoint&) = delete;
  WrittenTinyCheckpoint& operator=(const WrittenTinyCheckpoint&) = delete;

  const std::shared_ptr<const Checkpoint>& checkpoint() const { return checkpoint_; }

 private:
  std::string dir_;
  std::shared_ptr<const Checkpoint> checkpoint_;
};

}  // namespace flotilla::testing_util
