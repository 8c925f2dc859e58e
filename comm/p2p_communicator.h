// Collectives built from one point-to-point primitive, for host-memory
// backends (local, ucx): a backend implements Exchange() and inherits every
// collective, so they share one algorithm and one set of argument checks.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "comm/communicator.h"

namespace flotilla::comm {

class P2pCommunicator : public Communicator {
 public:
  int rank() const final { return rank_; }
  int size() const final { return size_; }

  absl::Status AllReduce(void* buffer, size_t count, DataType type, void* stream = nullptr) final;
  absl::Status AllGather(const void* send, void* recv, size_t bytes_per_rank,
                         void* stream = nullptr) final;
  absl::Status Broadcast(void* buffer, size_t bytes, int root, void* stream = nullptr) final;
  absl::Status AllToAllV(const void* send, absl::Span<const size_t> send_counts,
                         absl::Span<const size_t> send_offsets, void* recv,
                         absl::Span<const size_t> recv_counts,
                         absl::Span<const size_t> recv_offsets, void* stream = nullptr) final;
  absl::Status Barrier(void* stream = nullptr) final;

 protected:
  struct SendOp {
    int peer;
    const void* data;
    size_t bytes;
  };
  struct RecvOp {
    int peer;
    void* data;
    size_t bytes;  // exactly what the peer must send; anything else is INVALID_ARGUMENT
  };

  P2pCommunicator(int rank, int size) : rank_(rank), size_(size) {}

  // Posts every send and receive of one step, all carrying `tag` (unique per
  // step and the same on every rank), and returns when all of them are done.
  // Never targets this rank. Zero-byte messages are real messages (they carry
  // the count). A dead or silent peer gives UNAVAILABLE after the timeout.
  virtual absl::Status Exchange(uint64_t tag, absl::Span<const SendOp> sends,
                                absl::Span<const RecvOp> recvs) = 0;

 private:
  // Begins a collective: fails at once when the communicator is broken and
  // returns the tag base of this collective.
  absl::Status Begin(uint64_t* tag);
  // Runs Exchange and marks the communicator broken on UNAVAILABLE.
  absl::Status Step(uint64_t tag, absl::Span<const SendOp> sends,
                    absl::Span<const RecvOp> recvs);

  const int rank_;
  const int size_;
  uint64_t sequence_ = 0;
  absl::Status broken_;
  std::vector<SendOp> sends_;
  std::vector<RecvOp> recvs_;
  std::vector<uint8_t> scratch_;  // AllReduce: the peers' copies of this rank's chunk
};

}  // namespace flotilla::comm
