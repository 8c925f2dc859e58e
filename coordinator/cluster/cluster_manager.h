// ClusterManager: the coordinator's whole cluster. It splits the workers into
// model instances (cluster/instance.h: each placed, formed, failed and drained
// on its own), checks every request before anything else, routes it to an
// instance (cluster/router.h), and when that instance fails or is drained
// continues the request on another one (cluster/migration.h), so the client
// sees neither an error nor a repeated or missing token. gRPC reactors and the
// HTTP front end reach the cluster only through these methods.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "coordinator/cluster/cluster_types.h"
#include "coordinator/cluster/instance.h"
#include "coordinator/cluster/prefix_index.h"
#include "coordinator/cluster/router.h"
#include "coordinator/serving_metrics.h"
#include "proto/admin.pb.h"
#include "proto/cluster.pb.h"

namespace flotilla::coordinator {

struct TrackedRequest;  // cluster/migration.h

class ClusterManager {
 public:
  static absl::StatusOr<std::unique_ptr<ClusterManager>> Create(ClusterOptions options);
  ~ClusterManager();

  // Latency and token metrics of every request (any API), one set per
  // instance, as Prometheus text with `labels` (model_name=...) and each
  // instance's label on every series.
  void RenderServingMetrics(const std::string& labels, std::string& out) const;

  // ---- worker sessions ----
  // A new stream opened; returns its id for the calls below. Its Hello
  // decides its instance: the one it belonged to, else the one missing the
  // most workers, else a new instance once enough extra workers registered.
  uint64_t OnSessionOpened(std::shared_ptr<WorkerSession> session);
  void OnWorkerMessage(uint64_t session_id, const cluster::WorkerMessage& message);
  void OnSessionClosed(uint64_t session_id);

  // ---- requests ----
  // Checks the request (INVALID_ARGUMENT whatever the state of the
  // instances), then routes it. UNAVAILABLE while no instance serves (names
  // each one's reason), RESOURCE_EXHAUSTED when too many requests are in
  // flight. `route_key` (a conversation: previous_response_id or a session
  // header) keeps related requests on one instance while that is good.
  absl::StatusOr<uint64_t> Submit(cluster::SubmitSequence request, RequestCallbacks callbacks,
                                  const std::string& route_key = "");
  // Instance 0's engine measurement (see Instance::MeasureEngine).
  void MeasureEngine(const cluster::MeasureEngineRequest& request, absl::Time deadline,
                     MeasureCallback done);
  // Cancels a request; its on_done gets `code` (CANCELLED, or
  // DEADLINE_EXCEEDED for a request ended at its deadline). False if unknown.
  bool Cancel(uint64_t request_id, const std::string& reason,
              absl::StatusCode code = absl::StatusCode::kCancelled);
  // The client took prompt logits of the request: its sequence may have sent
  // `allowed_bytes` of them in all (prompt_logits_credit.h); its instance
  // tells the DP-group leader, where the sequence waits beyond its credit.
  void GrantPromptLogits(uint64_t request_id, uint64_t allowed_bytes);

  // Blocks until an instance serves or `timeout` passes.
  bool WaitReady(absl::Duration timeout);

  // ---- drain ----
  // From now on Submit refuses with UNAVAILABLE ("shutting down"); requests
  // in flight go on (and no longer move between instances). Not undone.
  void BeginDrain();
  bool draining() const { return draining_; }
  // Requests submitted and not yet ended.
  int InflightRequests() const;
  // Ends every request in flight with UNAVAILABLE (`why`): the stop after a drain.
  void FailAll(const std::string& why);

  // ---- admin ----
  // The cluster (READY while any instance serves) with each instance.
  admin::ClusterStatus Status() const;
  absl::StatusOr<admin::PlacementInfo> GetPlacement(int instance = 0) const;
  absl::StatusOr<cluster::ExpertMap> GetExpertMap(int instance = 0) const;
  // Expert balancing acts on one instance (SetExpertMap: the map's
  // `instance`; GetExpertMap's answer names its instance).
  absl::StatusOr<cluster::ExpertMap> SetExpertMap(const cluster::ExpertMap& map);
  absl::StatusOr<admin::ExpertLoadReport> ExpertLoad(const admin::ExpertLoadRequest& request) const;
  absl::StatusOr<admin::RebalanceResult> Rebalance(const admin::RebalanceRequest& request);
  // Stops / resumes admission to `worker_id`'s DP group.
  absl::StatusOr<admin::DrainResult> Drain(const std::string& worker_id, bool drained);
  // Stops / resumes admission to a whole instance. Draining moves its
  // requests in flight to other instances (when migration is on and another
  // serves; otherwise they finish where they are).
  absl::StatusOr<admin::DrainResult> DrainInstance(int instance, bool drained);
  const ClusterOptions& options() const { return options_; }
  int instance_count() const;

 private:
  explicit ClusterManager(ClusterOptions options);

  struct SessionRoute {
    int instance = -1;        // -1 before its Hello
    uint64_t inner_id = 0;    // the instance's session id
    std::shared_ptr<WorkerSession> session;
  };

  Instance* InstanceAt(int index) const;
  absl::StatusOr<Instance*> AdminInstance(uint32_t index) const;
  // The instance a worker saying Hello joins (a new one if every instance is whole).
  int InstanceForWorkerLocked(const std::string& worker_id);
  // Starts (or restarts after a failure) `t` on an instance chosen by the
  // router, `avoid` last. False when none took it.
  bool Place(const std::shared_ptr<TrackedRequest>& t, int avoid, absl::Status* why);
  // The attempt's callbacks, which feed `t` and notice a failed instance.
  RequestCallbacks AttemptCallbacks(const std::shared_ptr<TrackedRequest>& t, int attempt);
  void OnAttemptDone(const std::shared_ptr<TrackedRequest>& t, int attempt,
                     const absl::Status& status);
  // Ends `t` for the client (once).
  void Finish(const std::shared_ptr<TrackedRequest>& t, const absl::Status& status);
  // Why no instance takes requests now, one clause per instance.
  std::string NotServingReason() const;
  bool MigrationOn() const;
  void ParkedLoop();
  ServingMetrics& MetricsOf(int instance) const;

  const ClusterOptions options_;
  Router router_;
  // What each instance's prefix caches hold, from the leaders' KvEvents.
  PrefixIndex prefix_index_;

  mutable std::mutex mu_;  // instances_, sessions_, requests_, parked_
  std::vector<std::unique_ptr<Instance>> instances_;
  std::vector<std::unique_ptr<ServingMetrics>> metrics_;  // by instance
  std::map<uint64_t, SessionRoute> sessions_;
  uint64_t next_session_id_ = 1;
  std::map<uint64_t, std::shared_ptr<TrackedRequest>> requests_;
  uint64_t next_request_id_ = 1;
  uint64_t requests_migrated_ = 0;
  // Requests whose instance failed while no other served: placed again as
  // soon as one does, or failed after migration_wait.
  std::vector<std::shared_ptr<TrackedRequest>> parked_;

  std::atomic<bool> draining_{false};
  std::atomic<bool> stop_{false};
  std::mutex parked_mu_;
  std::condition_variable parked_cv_;
  std::thread parked_thread_;
};

}  // namespace flotilla::coordinator
