// The host communicator every distributed part of Flotilla moves bytes
// through. Backends: comm/local (threads of one process), comm/ucx (host
// memory across processes and nodes), comm/file (bootstrap of multi-process
// GPU tests). GPU ranks' device buffers move through a device transport
// (comm/exchange_transport.h) instead, bootstrapped over this one. This
// header needs neither CUDA nor any backend: `stream` arguments are `void*`
// and every backend here ignores them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace flotilla::comm {

// Element types AllReduce sums.
enum class DataType : uint8_t {
  kF32,   // IEEE float
  kBf16,  // bfloat16 bits (uint16_t); sums accumulate in float, round once
};

size_t DataTypeSize(DataType type);
absl::string_view DataTypeName(DataType type);

// One rank's endpoint in a group of size() ranks.
//
// Contract shared by every backend:
// - Every rank calls the same collectives in the same order with matching
//   arguments (same byte counts, same root); a collective returns when this
//   rank's part is done.
// - One thread at a time calls into a communicator.
// - Buffers are host memory. `stream` is for a device-memory backend (a
//   cudaStream_t; none exists now); host backends ignore it and always
//   complete.
// - A peer that failed, vanished or did not take part within the backend's
//   configured timeout gives UNAVAILABLE; no call waits forever.
// - Arguments this rank can check alone (wrong number of counts, a root out of
//   range) give INVALID_ARGUMENT before anything is sent; the group stays
//   usable. A peer sending a different byte count than this rank expects also
//   gives INVALID_ARGUMENT, but the ranks are then out of step.
// - After a failure of the exchange itself the communicator is broken and every
//   later call returns UNAVAILABLE at once: build a new one (new bootstrap).
class Communicator {
 public:
  virtual ~Communicator() = default;

  // This rank's index in [0, size()).
  virtual int rank() const = 0;

  // Number of ranks in the group (>= 1).
  virtual int size() const = 0;

  // Sums `count` elements of `type` element-wise over all ranks, in place: on
  // return every rank's `buffer` holds the same sum, bit for bit.
  virtual absl::Status AllReduce(void* buffer, size_t count, DataType type,
                                 void* stream = nullptr) = 0;

  // Concatenates every rank's `bytes_per_rank` bytes of `send` in rank order
  // into `recv` (size() * bytes_per_rank bytes). `send` may be the slice of
  // `recv` at rank() * bytes_per_rank (in place).
  virtual absl::Status AllGather(const void* send, void* recv, size_t bytes_per_rank,
                                 void* stream = nullptr) = 0;

  // Copies `bytes` bytes of `buffer` on rank `root` into `buffer` on every rank.
  virtual absl::Status Broadcast(void* buffer, size_t bytes, int root, void* stream = nullptr) = 0;

  // Personalised exchange with per-peer byte counts (zero and uneven allowed):
  // this rank sends send_counts[p] bytes from send + send_offsets[p] to rank p,
  // and receives recv_counts[p] bytes from rank p into recv + recv_offsets[p].
  // Every span has size() entries; recv_counts[p] on this rank must equal
  // send_counts[rank()] on rank p (see AllToAllVExchangingCounts when the
  // receiver does not know them). Send and receive regions must not overlap.
  virtual absl::Status AllToAllV(const void* send, absl::Span<const size_t> send_counts,
                                 absl::Span<const size_t> send_offsets, void* recv,
                                 absl::Span<const size_t> recv_counts,
                                 absl::Span<const size_t> recv_offsets, void* stream = nullptr) = 0;

  // Tells every rank how much every peer will send it: recv_counts[p] becomes
  // send_counts[rank()] of rank p. Both spans are HOST memory with size()
  // entries on every backend. The default runs AllToAllV on host buffers; a
  // device-memory backend would override it.
  virtual absl::Status ExchangeCounts(absl::Span<const size_t> send_counts,
                                      absl::Span<size_t> recv_counts);

  // Returns once every rank has entered Barrier.
  virtual absl::Status Barrier(void* stream = nullptr) = 0;

  // How long the following calls wait for a silent peer before UNAVAILABLE
  // (the backend's configured timeout until this is called; must be
  // positive). A rank that knows a peer is busy for long (a step with many
  // prompt-logit rows) raises it for that wait instead of taking the peer for
  // dead. Backends whose waits the host does not bound ignore it.
  virtual void SetTimeout(absl::Duration timeout) {}
};

// AllToAllV for a receiver that does not know what it will get: exchanges the
// counts first (ExchangeCounts), packs what arrives in rank order from offset 0
// of `recv`, and returns the counts and offsets it used. When the total exceeds
// `recv_capacity` bytes it returns RESOURCE_EXHAUSTED before moving any data;
// the peers then time out in the data exchange, so size `recv` for the worst case.
absl::Status AllToAllVExchangingCounts(Communicator& comm, const void* send,
                                       absl::Span<const size_t> send_counts,
                                       absl::Span<const size_t> send_offsets, void* recv,
                                       size_t recv_capacity, std::vector<size_t>* recv_counts,
                                       std::vector<size_t>* recv_offsets, void* stream = nullptr);

// Checks the shape of AllToAllV arguments (one entry per rank); shared by backends.
absl::Status ValidateAllToAllV(int size, absl::Span<const size_t> send_counts,
                               absl::Span<const size_t> send_offsets,
                               absl::Span<const size_t> recv_counts,
                               absl::Span<const size_t> recv_offsets);

// Offsets of `counts` laid out back to back from 0.
std::vector<size_t> PackedOffsets(absl::Span<const size_t> counts);

}  // namespace flotilla::comm
