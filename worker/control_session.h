// The Session stream with the coordinator over gRPC: a writer thread sends
// queued messages (split when one is too large), a reader thread collects
// the coordinator's messages for Receive, a heartbeat thread reports load.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

#include "proto/cluster.grpc.pb.h"
#include "worker/coordinator_client.h"
#include "worker/worker_options.h"

namespace flotilla::worker {

class ControlSession final : public CoordinatorClient {
 public:
  // Uses options.coordinator, connect_timeout, cluster_token and tls.
  explicit ControlSession(const WorkerOptions& options);
  ~ControlSession() override;

  absl::Status Connect() override;
  absl::Status Open(cluster::WorkerMessage hello, LoadReporter report,
                    UrgentHandler urgent) override;
  void Send(cluster::WorkerMessage message) override;
  void ReportLoadNow() override;
  std::vector<cluster::CoordinatorMessage> Receive(absl::Duration wait) override;
  bool Ended() const override { return ended_; }
  void Close() override;
  absl::Status Finish() override;

 private:
  void WriterLoop();
  void ReaderLoop();
  void HeartbeatLoop();

  const WorkerOptions options_;
  LoadReporter report_;
  UrgentHandler urgent_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<cluster::ClusterControl::Stub> stub_;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<cluster::WorkerMessage, cluster::CoordinatorMessage>>
      stream_;
  std::thread writer_, reader_, heartbeat_;
  // Held while a heartbeat's load is read and queued, so that heartbeats
  // reach the outbox in the order their loads were read.
  std::mutex heartbeat_mu_;

  std::mutex outbox_mu_;
  std::condition_variable outbox_cv_;
  std::deque<cluster::WorkerMessage> outbox_;
  bool writer_done_ = false;  // under outbox_mu_

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<cluster::CoordinatorMessage> inbox_;
  std::atomic<bool> closing_{false};  // this side asked to end
  std::atomic<bool> ended_{false};
  std::atomic<uint32_t> heartbeat_ms_{250};
  absl::Status end_status_;  // under mu_
};

}  // namespace flotilla::worker
