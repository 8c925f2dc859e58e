#include "comm/local/local_communicator.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace flotilla::comm {

absl::StatusOr<std::shared_ptr<LocalRendezvous>> LocalRendezvous::Create(int size) {
  if (size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("LocalRendezvous: group size must be at least 1, got ", size));
  }
  return std::shared_ptr<LocalRendezvous>(new LocalRendezvous(size));
}

void LocalRendezvous::MarkDead(int rank) {
  absl::MutexLock lock(&mu_);
  if (rank >= 0 && rank < size_) dead_[static_cast<size_t>(rank)] = true;
}

absl::StatusOr<std::unique_ptr<LocalCommunicator>> LocalCommunicator::Create(
    std::shared_ptr<LocalRendezvous> rendezvous, int rank, LocalOptions options) {
  if (rendezvous == nullptr) return absl::InvalidArgumentError("LocalCommunicator: no rendezvous");
  if (rank < 0 || rank >= rendezvous->size()) {
    return absl::InvalidArgumentError(absl::StrCat("LocalCommunicator: rank ", rank,
                                                   " is outside a group of ", rendezvous->size()));
  }
  if (options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("LocalCommunicator: timeout must be positive");
  }
  {
    absl::MutexLock lock(&rendezvous->mu_);
    if (rendezvous->claimed_[static_cast<size_t>(rank)]) {
      return absl::AlreadyExistsError(
          absl::StrCat("LocalCommunicator: rank ", rank, " was already created"));
    }
    rendezvous->claimed_[static_cast<size_t>(rank)] = true;
  }
  return std::unique_ptr<LocalCommunicator>(
      new LocalCommunicator(std::move(rendezvous), rank, options));
}

LocalCommunicator::~LocalCommunicator() { rendezvous_->MarkDead(rank()); }

absl::Status LocalCommunicator::Exchange(uint64_t tag, absl::Span<const SendOp> sends,
                                         absl::Span<const RecvOp> recvs) {
  LocalRendezvous& rv = *rendezvous_;
  absl::MutexLock lock(&rv.mu_);
  for (const SendOp& s : sends) {
    const auto* p = static_cast<const uint8_t*>(s.data);
    rv.mail_[{s.peer, rank(), tag}] = std::vector<uint8_t>(p, p + s.bytes);
  }
  const absl::Time deadline = absl::Now() + options_.timeout;
  for (const RecvOp& r : recvs) {
    const LocalRendezvous::Key key{rank(), r.peer, tag};
    auto ready = [&]() {
      return rv.mail_.count(key) > 0 || rv.dead_[static_cast<size_t>(r.peer)];
    };
    while (!ready()) {
      // Await with a condition re-evaluated on every unlock: sends wake receivers.
      if (rv.mu_.AwaitWithDeadline(absl::Condition(&ready), deadline)) break;
      return absl::UnavailableError(absl::StrCat("rank ", rank(), ": no message from rank ",
                                                 r.peer, " within ",
                                                 absl::FormatDuration(options_.timeout)));
    }
    auto it = rv.mail_.find(key);
    if (it == rv.mail_.end()) {
      return absl::UnavailableError(
          absl::StrCat("rank ", rank(), ": peer rank ", r.peer, " is gone"));
    }
    if (it->second.size() != r.bytes) {
      absl::Status st = absl::InvalidArgumentError(
          absl::StrCat("rank ", rank(), ": rank ", r.peer, " sent ", it->second.size(),
                       " bytes where ", r.bytes, " were expected"));
      rv.mail_.erase(it);
      return st;
    }
    if (r.bytes > 0) std::memcpy(r.data, it->second.data(), r.bytes);
    rv.mail_.erase(it);
  }
  return absl::OkStatus();
}

}  // namespace flotilla::comm
