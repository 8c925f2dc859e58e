// Ranks of one host meeting in a directory: every message is a file
// (written under a temporary name, then renamed into place) that its
// receiver polls for, reads and deletes. Slow (milliseconds a message) and
// host memory only, but it needs nothing beyond a shared directory, so it
// bootstraps GPU contexts of separate processes in tests and benchmarks.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "comm/p2p_communicator.h"

namespace flotilla::comm {

struct FileOptions {
  // How long a rank waits for a peer's message before UNAVAILABLE.
  absl::Duration timeout = absl::Seconds(60);
};

class FileCommunicator final : public P2pCommunicator {
 public:
  // `dir` must exist and be the same for all `size` ranks, and hold no
  // messages of an earlier group.
  static absl::StatusOr<std::unique_ptr<FileCommunicator>> Create(std::string dir, int rank,
                                                                  int size,
                                                                  const FileOptions& options = {});

 private:
  FileCommunicator(std::string dir, int rank, int size, const FileOptions& options)
      : P2pCommunicator(rank, size), dir_(std::move(dir)), options_(options) {}
  absl::Status Exchange(uint64_t tag, absl::Span<const SendOp> sends,
                        absl::Span<const RecvOp> recvs) override;
  std::string PathOf(uint64_t tag, int from, int to) const;

  std::string dir_;
  FileOptions options_;
};

}  // namespace flotilla::comm
