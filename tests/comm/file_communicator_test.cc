// The file communicator with threads of one process as ranks (its messages
// are files, so threads exercise it as well as processes would).
#include "comm/file/file_communicator.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <thread>
#include <vector>

#include "tests/comm/collective_checks.h"

namespace flotilla::comm {
namespace {

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/flotilla_file_comm.XXXXXX";
    path_ = mkdtemp(tmpl);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

class FileCollectivesTest : public ::testing::TestWithParam<int> {};

TEST_P(FileCollectivesTest, EveryCollectiveGivesTheExpectedData) {
  const int w = GetParam();
  TempDir dir;
  std::vector<absl::Status> results(static_cast<size_t>(w));
  std::vector<std::thread> threads;
  for (int r = 0; r < w; ++r) {
    threads.emplace_back([&, r] {
      auto comm = FileCommunicator::Create(dir.path(), r, w);
      results[static_cast<size_t>(r)] =
          comm.ok() ? testing::RunCollectiveChecks(**comm) : comm.status();
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < w; ++r) EXPECT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r];
  // Receivers delete what they read: nothing is left behind.
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
}

INSTANTIATE_TEST_SUITE_P(Worlds, FileCollectivesTest, ::testing::Values(1, 2, 3));

TEST(FileCommunicatorTest, SilentPeerGivesUnavailable) {
  TempDir dir;
  auto comm = FileCommunicator::Create(dir.path(), 0, 2, {absl::Milliseconds(50)});
  ASSERT_TRUE(comm.ok()) << comm.status();
  EXPECT_TRUE(absl::IsUnavailable((*comm)->Barrier()));
  EXPECT_TRUE(absl::IsUnavailable((*comm)->Barrier()));  // broken for good
}

TEST(FileCommunicatorTest, RejectsAMissingDirectory) {
  EXPECT_FALSE(FileCommunicator::Create("/nonexistent/flotilla", 0, 1).ok());
}

}  // namespace
}  // namespace flotilla::comm
