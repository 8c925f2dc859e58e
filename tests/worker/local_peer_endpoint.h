// In-process peer endpoints, so that a whole instance of WorkerRuntimes runs
// in one process (WorkerRuntime::Create's PeerEndpointFactory): each rank's
// Join makes its LocalCommunicator of the generation's shared rendezvous,
// wrapped in a FakeCommunicator the test scripts (a peer that dies mid-step,
// one that stalls).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "absl/strings/str_cat.h"
#include "comm/local/local_communicator.h"
#include "tests/comm/fake_communicator.h"
#include "worker/peer_endpoint.h"

namespace flotilla::worker {

class LocalPeers {
 public:
  // Applied to rank `rank`'s communicator as it joins a generation.
  using Script = std::function<void(comm::LocalRendezvous& rendezvous,
                                    comm::testing::FakeCommunicator& communicator)>;

  explicit LocalPeers(int world) : world_(world) {}

  void SetScript(int rank, Script script) {
    std::lock_guard<std::mutex> lock(mu_);
    scripts_[rank] = std::move(script);
  }

  // What a WorkerRuntime opens its endpoints with; `this` must outlive it.
  PeerEndpointFactory Factory() {
    return [this](cluster::CommBackend,
                  const PeerOptions& options) -> absl::StatusOr<std::unique_ptr<PeerEndpoint>> {
      return std::unique_ptr<PeerEndpoint>(new Endpoint(this, options));
    };
  }

 private:
  class Endpoint final : public PeerEndpoint {
   public:
    Endpoint(LocalPeers* peers, PeerOptions options) : peers_(peers), options_(options) {}
    std::string Address() const override { return "local"; }
    absl::StatusOr<std::unique_ptr<comm::Communicator>> Join(
        int rank, const cluster::StartComm& start) override {
      return peers_->Join(rank, start.generation(), options_);
    }

   private:
    LocalPeers* peers_;
    PeerOptions options_;
  };

  absl::StatusOr<std::unique_ptr<comm::Communicator>> Join(int rank, uint64_t generation,
                                                           const PeerOptions& options) {
    std::shared_ptr<comm::LocalRendezvous> rendezvous;
    Script script;
    {
      std::lock_guard<std::mutex> lock(mu_);
      std::shared_ptr<comm::LocalRendezvous>& shared = rendezvous_[generation];
      if (!shared) {
        absl::StatusOr<std::shared_ptr<comm::LocalRendezvous>> made =
            comm::LocalRendezvous::Create(world_);
        if (!made.ok()) return made.status();
        shared = *made;
      }
      rendezvous = shared;
      auto it = scripts_.find(rank);
      if (it != scripts_.end()) script = it->second;
    }
    comm::LocalOptions local;
    local.timeout = options.timeout;
    absl::StatusOr<std::unique_ptr<comm::LocalCommunicator>> inner =
        comm::LocalCommunicator::Create(rendezvous, rank, local);
    if (!inner.ok()) return inner.status();
    auto fake = std::make_unique<comm::testing::FakeCommunicator>(std::move(*inner));
    if (script) script(*rendezvous, *fake);
    return std::unique_ptr<comm::Communicator>(std::move(fake));
  }

  const int world_;
  std::mutex mu_;
  std::map<uint64_t, std::shared_ptr<comm::LocalRendezvous>> rendezvous_;
  std::map<int, Script> scripts_;
};

}  // namespace flotilla::worker
