// Instance: one model instance of the cluster: its workers' registry and
// liveness, their placement into ranks, the generations it forms, and the
// requests it runs. It owns its state behind one mutex; the ClusterManager
// (cluster_manager.h) hands it the sessions of its workers and the requests
// the router sends it. Sessions are behind the WorkerSession interface so
// tests drive it with fakes.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/model_config.h"
#include "coordinator/cluster/cluster_types.h"
#include "coordinator/cluster/engine_measurements.h"
#include "coordinator/cluster/expert_load_window.h"
#include "coordinator/cluster/placement.h"
#include "proto/admin.pb.h"
#include "proto/cluster.pb.h"

namespace flotilla::coordinator {

// What the router weighs for an instance.
struct InstanceLoad {
  bool serving = false;      // READY and admitting (not drained)
  int requests = 0;          // in flight
  uint64_t kv_blocks_free = 0;   // the DP leaders' reports, summed
  uint64_t kv_blocks_total = 0;
  uint32_t queued_sequences = 0;
};

class Instance {
 public:
  // `options.expected_workers` are this instance's workers; `id` names it in
  // logs, states and metrics.
  static absl::StatusOr<std::unique_ptr<Instance>> Create(ClusterOptions options, int id = 0);
  ~Instance();

  int id() const { return id_; }

  // ---- worker sessions ----
  // A new stream opened; returns its id for the calls below.
  uint64_t OnSessionOpened(std::shared_ptr<WorkerSession> session);
  void OnWorkerMessage(uint64_t session_id, const cluster::WorkerMessage& message);
  void OnSessionClosed(uint64_t session_id);

  // ---- requests ----
  // Sends a request the ClusterManager validated to a DP group. UNAVAILABLE
  // while the instance is not ready (names the missing workers) or drained.
  absl::StatusOr<uint64_t> Submit(cluster::SubmitSequence request, RequestCallbacks callbacks);
  // Asks every rank to time its engine between steps (admin MeasureEngine;
  // the ranks of a sharded instance run the probe together, in lockstep).
  // `done` gets the measurement of the leader of DP group 0 once every rank
  // has answered, or why there is none (FAILED_PRECONDITION while not
  // serving, the first refusal of any rank, UNAVAILABLE if a rank dies or
  // the instance is formed again, DEADLINE_EXCEEDED after `deadline`),
  // exactly once and without the manager's lock held.
  void MeasureEngine(const cluster::MeasureEngineRequest& request, absl::Time deadline,
                     MeasureCallback done);
  // Cancels a request; its on_done gets `code` (CANCELLED, or
  // DEADLINE_EXCEEDED for a request ended at its deadline: /metrics counts it
  // as one). Returns false if unknown.
  bool Cancel(uint64_t request_id, const std::string& reason,
              absl::StatusCode code = absl::StatusCode::kCancelled);
  // Sends the request's DP-group leader credit for its prompt logits
  // (PromptLogitsCredit: `allowed_bytes` sent in all); nothing if unknown.
  void GrantPromptLogits(uint64_t request_id, uint64_t allowed_bytes);

  // Blocks until the instance is ready or `timeout` passes.
  bool WaitReady(absl::Duration timeout);

  // ---- drain ----
  // Requests submitted and not yet ended.
  int InflightRequests() const;
  // Ends every request in flight with UNAVAILABLE (`why`).
  void FailAll(const std::string& why);
  // Stops (or resumes) admission to the whole instance (flotillactl drain
  // INSTANCE); requests in flight go on.
  void SetDrained(bool drained);
  bool drained() const;
  InstanceLoad Load() const;
  // Whether `worker_id` registered with this instance (alive or not).
  bool HasWorker(const std::string& worker_id) const;
  // Workers registered and alive.
  int AliveWorkers() const;

  // ---- admin ----
  // The instance's state, workers and requests; the ClusterManager merges them.
  admin::ClusterStatus Status() const;
  admin::InstanceStatus InstanceStatusProto() const;
  absl::StatusOr<admin::PlacementInfo> GetPlacement() const;
  absl::StatusOr<cluster::ExpertMap> GetExpertMap() const;
  // Validates `map` (next version, same shape, experts only where they are
  // held) and sends it to every rank; they switch at one step boundary.
  // Validates `map` (next version, same shape, slots within each rank's
  // reported slots) and applies it in two phases: every rank loads the
  // experts it lacks (PREPARE), then all switch at one step boundary
  // (COMMIT); if a rank fails or times out, ABORT keeps the current map.
  absl::StatusOr<cluster::ExpertMap> SetExpertMap(const cluster::ExpertMap& map);
  // Per-layer, per-rank expert load of the current map over `window`.
  absl::StatusOr<admin::ExpertLoadReport> ExpertLoad(const admin::ExpertLoadRequest& request) const;
  // Plans from the window's load and, unless a dry run, applies the plan.
  absl::StatusOr<admin::RebalanceResult> Rebalance(const admin::RebalanceRequest& request);
  // Stops / resumes admission to `worker_id`'s DP group.
  absl::StatusOr<admin::DrainResult> Drain(const std::string& worker_id, bool drained);
  const ClusterOptions& options() const { return options_; }

 private:
  Instance(ClusterOptions options, int id);
  absl::Time Now() const { return options_.clock->TimeNow(); }

  struct Worker {
    std::string worker_id;
    uint64_t session_id = 0;  // 0 when disconnected
    std::shared_ptr<WorkerSession> session;
    cluster::Hello hello;
    absl::Time last_heard;
    bool alive = false;
    int rank = -1;
    uint64_t ready_generation = 0;   // shards loaded for this generation
    uint64_t joined_generation = 0;  // communicator joined for this generation
    cluster::Ready ready;
    cluster::WorkerLoad load;
    absl::Time died_at;  // when it was marked dead
  };
  struct Request {
    uint64_t id = 0;
    int dp_group = 0;
    RequestCallbacks callbacks;
  };
  struct Finished {
    RequestCallbacks callbacks;
    absl::Status status;
    std::optional<cluster::SequenceUpdate> last_update;
  };

  void HandleHello(uint64_t session_id, const cluster::Hello& hello, std::vector<Finished>* done);
  // Delivers the updates of requests assigned to `sender`'s DP group (it is
  // its leader); any other update is dropped and ends `sender`'s session.
  void HandleTokens(Worker& sender, const cluster::TokenBatch& batch,
                    std::vector<std::pair<RequestCallbacks, cluster::SequenceUpdate>>* updates,
                    std::vector<Finished>* done);
  // Marks a worker dead, fails in-flight requests, degrades the instance.
  void MarkDeadLocked(Worker& w, const std::string& why, std::vector<Finished>* done);
  // A rank of the serving generation failed a step but its worker lives:
  // fails every request in flight (UNAVAILABLE, `why`) and assigns a new
  // generation to the same workers.
  void ReformLocked(const std::string& why, std::vector<Finished>* done);
  // Ends every request in flight with UNAVAILABLE (`why`).
  void FailInflightLocked(const std::string& why, std::vector<Finished>* done);
  // Tells every live rank holder but `except` to drop the current generation
  // at once (DropGeneration): a peer is gone, so their next collective would
  // only wait out the communicator's timeout.
  void DropGenerationLocked(const std::string& why, const Worker* except);
  // Erases dead workers without a rank, dead for longer than the options say.
  void ForgetDeadWorkersLocked(absl::Time now);
  // Plans and sends assignments when every expected worker is alive.
  void MaybeAssignLocked();
  // The workers to hold each rank of the current placement: the alive holders,
  // newcomers (from `candidates`) in the places of the gone. Empty, with the
  // state message saying why, while no fitting newcomer is there.
  std::vector<Worker*> ChooseHoldersLocked(const std::vector<Worker*>& candidates);
  void UpdateReadyLocked();
  std::string MissingWorkersLocked() const;
  Worker* WorkerBySessionLocked(uint64_t session_id);
  void MonitorLoop();
  static void Deliver(std::vector<Finished>& done);
  // Failed measurements, delivered with the finished requests.
  static void AddFailedMeasurements(std::vector<MeasureResult> failed,
                                    std::vector<Finished>* done);
  // Adds to the leader's measurement its device and the instance's layout.
  void DescribeMeasuredLocked(cluster::EngineMeasurement* m);
  // ---- expert balancing (cluster_manager_experts.cc) ----
  // A rank's answer to PREPARE.
  void OnExpertMapPreparedLocked(const Worker& w, const cluster::ExpertMapPrepared& prepared);
  // Sends `update` to every rank of the placement.
  void SendToRanksLocked(const cluster::CoordinatorMessage& message);
  // The two phases of a validated map; waits without the lock held.
  absl::Status ApplyExpertMap(const ExpertMap& map);
  absl::Status CheckExpertMapLocked(const ExpertMap& map) const;
  // FAILED_PRECONDITION for the tensor-parallel MoE layout, which has no
  // whole experts to move. Needs a placement.
  absl::Status CheckBalancingAppliesLocked() const;
  // The DP group to admit to (least in flight, not drained); -1 if none.
  int ChooseGroupLocked() const;
  void AddDrainStatusLocked(admin::ClusterStatus* status) const;
  void AutoRebalanceLoop();

  const ClusterOptions options_;
  const int id_;
  mutable std::mutex mu_;
  std::condition_variable ready_cv_;
  std::map<std::string, Worker> workers_;  // by worker id
  std::map<uint64_t, std::string> session_to_worker_;
  std::map<uint64_t, std::shared_ptr<WorkerSession>> pending_sessions_;  // before Hello
  uint64_t next_session_id_ = 1;
  admin::InstanceState state_ = admin::WAITING_FOR_WORKERS;
  std::string state_message_;
  uint64_t generation_ = 0;
  bool comm_started_ = false;  // StartComm sent for generation_
  std::optional<Placement> placement_;
  std::optional<ExpertMap> loaded_map_;  // the map whose experts the ranks loaded
  std::map<uint64_t, Request> requests_;
  uint64_t next_request_id_ = 1;
  uint64_t requests_submitted_ = 0;
  uint64_t requests_cancelled_ = 0;
  std::vector<uint32_t> group_inflight_;
  EngineMeasurements measurements_;

  // Expert balancing.
  ExpertLoadWindow expert_window_{absl::Seconds(61)};
  std::mutex rebalance_mu_;  // one map change at a time
  struct MapSwitch {
    uint64_t version = 0;
    uint64_t generation = 0;
    std::set<int> prepared;  // ranks
    std::string error;
    uint64_t bytes = 0;
  };
  std::optional<MapSwitch> map_switch_;  // under mu_
  std::condition_variable map_switch_cv_;
  std::set<int> drained_groups_;  // under mu_
  std::thread auto_rebalance_;

  bool drained_ = false;  // under mu_
  std::atomic<bool> stop_{false};
  std::mutex monitor_mu_;
  std::condition_variable monitor_cv_;
  std::thread monitor_;
};

}  // namespace flotilla::coordinator
