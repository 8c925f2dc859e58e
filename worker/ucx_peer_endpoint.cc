#include "absl/strings/str_cat.h"
#include "comm/ucx/ucx_communicator.h"
#include "common/comm_names.h"
#include "common/status.h"
#include "worker/peer_endpoint.h"

namespace flotilla::worker {
namespace {

class UcxPeerEndpoint final : public PeerEndpoint {
 public:
  UcxPeerEndpoint(std::unique_ptr<comm::UcxWorker> worker, PeerOptions options)
      : worker_(std::move(worker)), options_(std::move(options)) {}

  std::string Address() const override { return worker_->Address(); }

  absl::StatusOr<std::unique_ptr<comm::Communicator>> Join(
      int rank, const cluster::StartComm& start) override {
    if (!worker_) return absl::FailedPreconditionError("the peer endpoint was already joined");
    // Unkeyed tags would let anyone who learns an address into the group.
    if (start.comm().peer_secret().empty()) {
      return absl::InvalidArgumentError(
          "StartComm without a peer_secret: this worker does not join an unkeyed group");
    }
    std::vector<std::string> addresses(start.comm().peer_addresses().begin(),
                                       start.comm().peer_addresses().end());
    comm::UcxOptions uo;
    uo.timeout = options_.timeout;
    uo.interrupt = options_.interrupt;
    uo.peer_secret = start.comm().peer_secret();
    FLOTILLA_ASSIGN_OR_RETURN(
        std::unique_ptr<comm::UcxCommunicator> communicator,
        comm::UcxCommunicator::Create(std::move(worker_), rank, addresses, uo));
    return std::unique_ptr<comm::Communicator>(std::move(communicator));
  }

 private:
  std::unique_ptr<comm::UcxWorker> worker_;
  const PeerOptions options_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<PeerEndpoint>> OpenPeerEndpoint(cluster::CommBackend backend,
                                                               const PeerOptions& options) {
  if (backend != cluster::COMM_BACKEND_UCX) {
    return absl::InvalidArgumentError(absl::StrCat("the coordinator asked for host communicator ",
                                                   CommBackendName(backend),
                                                   "; this worker joins peers over ucx"));
  }
  comm::UcxOptions uo;
  uo.timeout = options.timeout;
  // Listen (TCP) only on the advertised interface; UCX_NET_DEVICES overrides.
  if (!options.net_device.empty())
    uo.config_defaults.push_back({"NET_DEVICES", options.net_device});
  FLOTILLA_ASSIGN_OR_RETURN(std::unique_ptr<comm::UcxWorker> worker, comm::UcxWorker::Create(uo));
  return std::unique_ptr<PeerEndpoint>(new UcxPeerEndpoint(std::move(worker), options));
}

}  // namespace flotilla::worker
