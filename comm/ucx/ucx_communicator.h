// Host-memory communicator over UCX (UCP tag matching): shared memory (posix,
// sysv, cma) between processes of one node, TCP across nodes, RDMA where the
// hardware and the UCX build have it. No RDMA hardware is needed.
//
// Bootstrap, per rank:
//   auto worker = UcxWorker::Create(options);          // this rank's endpoint
//   std::string mine = (*worker)->Address();          // bytes to publish
//   ... the coordinator (or a test) gathers every rank's bytes, in rank order ...
//   auto comm = UcxCommunicator::Create(std::move(*worker), rank, all_addresses, options);
// Create() connects to every peer and returns once all of them are reachable,
// so every rank calls it at about the same time.
//
// Environment: the process's UCX_* variables are honoured; UcxOptions::
// config_defaults are applied only to settings the environment leaves unset
// (by default UCX_TLS=sm,tcp,self, which works in a sandbox without RDMA,
// and UCX_MAX_RNDV_LANES=0: see config_defaults).
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "comm/p2p_communicator.h"

// UCX handles, so that this header does not include UCX.
typedef struct ucp_context* ucp_context_h;
typedef struct ucp_worker* ucp_worker_h;
typedef struct ucp_ep* ucp_ep_h;

namespace flotilla::comm {

struct UcxOptions {
  // How long a collective waits for a peer (and Create for every peer to be
  // reachable) before UNAVAILABLE.
  absl::Duration timeout = absl::Seconds(30);
  // How long a waiting rank spins on the network before it starts yielding the
  // CPU; spinning is what gives microsecond latency at decode sizes.
  absl::Duration spin = absl::Microseconds(10);
  // Ask UCX to report peer failures, so a dead peer gives UNAVAILABLE at once
  // rather than after `timeout`. UCX 1.13 then refuses its shared-memory
  // transports (they cannot detect a dead peer) and uses TCP even on one node,
  // which costs latency (measured on one node: about 16 us instead of 4 us
  // for a 1-token all-to-all between 2 processes). Off by default: on one
  // node the timeout finds dead peers; across nodes TCP or RDMA is used anyway.
  bool detect_peer_failure = false;
  // Shared by the group's ranks (handed out by the coordinator): message tags
  // are a keyed hash (SipHash-2-4) of (collective sequence, source rank), so
  // only holders of the secret can send a message any rank will match.
  // Empty: plain tags (tests, trusted hosts).
  std::string peer_secret;
  // When set and true, a collective in progress (or the next one) gives up
  // with UNAVAILABLE at once: the owner learned elsewhere that a peer is gone
  // (the worker: from its coordinator). Written from any thread.
  std::shared_ptr<const std::atomic<bool>> interrupt;
  // UCX settings (names without the UCX_ prefix) applied unless the
  // environment sets UCX_<name>.
  // MAX_RNDV_LANES=0: large messages (rendezvous) go through the active
  // message lanes (shared-memory buffers on one node) instead of a
  // single-copy lane. On one node that lane is cma, which reads the sender's
  // memory with process_vm_readv; when the sender has died in the meantime,
  // UCX 1.13 aborts the reading process unless peer failures are detected
  // (detect_peer_failure), so a rank killed mid-message would take the
  // survivors down with it. Costs bandwidth above about 100 KB per peer on
  // one node (measured: about the same up to 16 tokens of 2880 bf16 per
  // rank, up to ~1.6x slower at 64-256); decode sizes are unaffected.
  std::vector<std::pair<std::string, std::string>> config_defaults = {{"TLS", "sm,tcp,self"},
                                                                      {"MAX_RNDV_LANES", "0"}};
};

// One rank's UCX context and worker, before the group is connected.
class UcxWorker {
 public:
  static absl::StatusOr<std::unique_ptr<UcxWorker>> Create(const UcxOptions& options = {});
  ~UcxWorker();
  UcxWorker(const UcxWorker&) = delete;
  UcxWorker& operator=(const UcxWorker&) = delete;

  // This rank's bootstrap bytes: the UCX worker address in a checked envelope.
  const std::string& Address() const { return address_; }

 private:
  friend class UcxCommunicator;
  UcxWorker() = default;

  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  std::string address_;
};

class UcxCommunicator final : public P2pCommunicator {
 public:
  // Connects `worker` (rank `rank`) to every peer; `addresses[p]` is rank p's
  // UcxWorker::Address() (this rank's own entry included). Returns UNAVAILABLE
  // when a peer is not reachable within options.timeout.
  static absl::StatusOr<std::unique_ptr<UcxCommunicator>> Create(
      std::unique_ptr<UcxWorker> worker, int rank, const std::vector<std::string>& addresses,
      const UcxOptions& options = {});

  // Flushes what was sent, then closes the connections (bounded by the timeout).
  ~UcxCommunicator() override;

  void SetTimeout(absl::Duration timeout) override {
    if (timeout > absl::ZeroDuration()) options_.timeout = timeout;
  }

  // The UCX transports (lanes) used to reach `peer`, for logs and benchmarks.
  std::string TransportInfo(int peer) const;

 protected:
  absl::Status Exchange(uint64_t tag, absl::Span<const SendOp> sends,
                        absl::Span<const RecvOp> recvs) override;

 private:
  UcxCommunicator(std::unique_ptr<UcxWorker> worker, int rank, int size, const UcxOptions& options);
  // Waits for the requests of one step; on failure cancels what is left and
  // closes the endpoints, so no buffer of the step is touched afterwards.
  absl::Status Wait(absl::Span<const SendOp> sends, absl::Span<const RecvOp> recvs);
  // Cancels pending requests and force-closes every endpoint.
  void Abort();
  // Progresses the worker until `request` completes or `deadline` passes.
  bool ProgressUntilDone(void* request, absl::Time deadline);
  // The wire tag of collective `tag`'s message from rank `source`.
  uint64_t WireTag(uint64_t tag, int source) const;

  std::unique_ptr<UcxWorker> worker_;
  uint64_t tag_key_[2] = {0, 0};  // from options_.peer_secret
  bool keyed_tags_ = false;
  UcxOptions options_;
  std::vector<ucp_ep_h> eps_;
  // Per-peer failure reported by UCX's error callback (a ucs_status_t, 0 while
  // healthy); an array so that the callback's pointers stay valid.
  std::unique_ptr<int[]> peer_failure_;
  // Per-step bookkeeping, kept to avoid allocating on the step path.
  std::vector<void*> send_requests_;
  std::vector<void*> recv_requests_;
  std::vector<size_t> recv_lengths_;
  std::vector<int> recv_status_;
  bool aborted_ = false;
};

}  // namespace flotilla::comm
