// Threads of one process as ranks: each thread holds a LocalCommunicator made
// from one shared LocalRendezvous. For unit tests of the runtime, where a
// whole instance runs in one process. No bootstrap bytes: the rendezvous
// object is what the ranks share.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "comm/p2p_communicator.h"

namespace flotilla::comm {

struct LocalOptions {
  // How long a rank waits for a peer's message before UNAVAILABLE.
  absl::Duration timeout = absl::Seconds(30);
};

// The mailboxes the ranks of one group share. Thread-safe.
class LocalRendezvous {
 public:
  static absl::StatusOr<std::shared_ptr<LocalRendezvous>> Create(int size);

  int size() const { return size_; }

  // Marks `rank` as gone, as if its process had died: peers waiting for its
  // messages get UNAVAILABLE at once. A LocalCommunicator calls this when it is
  // destroyed; tests call it to simulate a crash.
  void MarkDead(int rank);

 private:
  friend class LocalCommunicator;
  explicit LocalRendezvous(int size) : size_(size), dead_(static_cast<size_t>(size), false) {}

  // (destination, source, tag) -> payload.
  using Key = std::tuple<int, int, uint64_t>;

  const int size_;
  absl::Mutex mu_;
  std::map<Key, std::vector<uint8_t>> mail_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> dead_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> claimed_ ABSL_GUARDED_BY(mu_) = std::vector<bool>(static_cast<size_t>(size_),
                                                                      false);
};

class LocalCommunicator final : public P2pCommunicator {
 public:
  // Rank `rank` of `rendezvous`; each rank may be created once.
  static absl::StatusOr<std::unique_ptr<LocalCommunicator>> Create(
      std::shared_ptr<LocalRendezvous> rendezvous, int rank, LocalOptions options = {});

  // Marks this rank dead in the rendezvous.
  ~LocalCommunicator() override;

  void SetTimeout(absl::Duration timeout) override {
    if (timeout > absl::ZeroDuration()) options_.timeout = timeout;
  }

 protected:
  absl::Status Exchange(uint64_t tag, absl::Span<const SendOp> sends,
                        absl::Span<const RecvOp> recvs) override;

 private:
  LocalCommunicator(std::shared_ptr<LocalRendezvous> rendezvous, int rank, LocalOptions options)
      : P2pCommunicator(rank, rendezvous->size()),
        rendezvous_(std::move(rendezvous)),
        options_(options) {}

  std::shared_ptr<LocalRendezvous> rendezvous_;
  LocalOptions options_;
};

}  // namespace flotilla::comm
