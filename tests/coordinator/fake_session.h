// A scriptable worker session for coordinator tests: records what the
// coordinator sends and whether it closed the session.
#pragma once

#include <mutex>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "coordinator/cluster/cluster_manager.h"
#include "proto/cluster.pb.h"

namespace flotilla::coordinator::test_fakes {

class FakeSession : public WorkerSession {
 public:
  void Send(const cluster::CoordinatorMessage& m) override {
    std::lock_guard<std::mutex> lock(mu);
    sent.push_back(m);
  }
  void Close(const absl::Status& status) override {
    std::lock_guard<std::mutex> lock(mu);
    closed = status;
  }
  // The messages of one kind sent so far.
  std::vector<cluster::CoordinatorMessage> Of(cluster::CoordinatorMessage::KindCase k) {
    std::lock_guard<std::mutex> lock(mu);
    std::vector<cluster::CoordinatorMessage> out;
    for (auto& m : sent) {
      if (m.kind_case() == k) out.push_back(m);
    }
    return out;
  }
  std::optional<absl::Status> Closed() {
    std::lock_guard<std::mutex> lock(mu);
    return closed;
  }
  std::mutex mu;
  std::vector<cluster::CoordinatorMessage> sent;
  std::optional<absl::Status> closed;
};

}  // namespace flotilla::coordinator::test_fakes
