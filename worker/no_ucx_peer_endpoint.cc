// A build without UCX: instances of several workers are refused.
#include "worker/peer_endpoint.h"

namespace flotilla::worker {

absl::StatusOr<std::unique_ptr<PeerEndpoint>> OpenPeerEndpoint(cluster::CommBackend,
                                                               const PeerOptions&) {
  return absl::FailedPreconditionError("this worker was built without UCX (FLOTILLA_UCX=OFF)");
}

}  // namespace flotilla::worker
