// The host communicator between the worker processes of an instance: an
// endpoint opened when a rank loads (its address goes into Ready) and joined
// into a communicator at StartComm, once every rank's address is known.
// Workers talk over UCX; a build without UCX refuses instances of W > 1.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "comm/communicator.h"
#include "proto/cluster.pb.h"

namespace flotilla::worker {

struct PeerOptions {
  absl::Duration timeout = absl::Seconds(10);
  // The only interface the endpoint listens on (empty: UCX's choice).
  std::string net_device;
  // Set (from any thread) to make a collective in progress give up at once.
  std::shared_ptr<const std::atomic<bool>> interrupt;
};

class PeerEndpoint {
 public:
  virtual ~PeerEndpoint() = default;
  // Where the peers reach this endpoint (sent in Ready).
  virtual std::string Address() const = 0;
  // The instance's communicator over this endpoint (used up by the call).
  virtual absl::StatusOr<std::unique_ptr<comm::Communicator>> Join(
      int rank, const cluster::StartComm& start) = 0;
};

// An endpoint of `backend` (what the coordinator's assignment names); any
// backend but UCX is refused with its name.
absl::StatusOr<std::unique_ptr<PeerEndpoint>> OpenPeerEndpoint(cluster::CommBackend backend,
                                                               const PeerOptions& options);

// How a worker opens its endpoint for each generation: OpenPeerEndpoint in
// the process, in-process endpoints in tests (a whole W > 1 instance of
// WorkerRuntimes in one process, over scripted communicators).
using PeerEndpointFactory = std::function<absl::StatusOr<std::unique_ptr<PeerEndpoint>>(
    cluster::CommBackend backend, const PeerOptions& options)>;

}  // namespace flotilla::worker
