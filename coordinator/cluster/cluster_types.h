// What the coordinator's cluster code shares: the options, a worker's
// session as the cluster sees it, and the callbacks of one request.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/model_config.h"
#include "coordinator/cluster/placement.h"
#include "coordinator/cluster/router_policy.h"
#include "proto/cluster.pb.h"

namespace flotilla::coordinator {

// The coordinator's end of one worker's Session stream.
class WorkerSession {
 public:
  virtual ~WorkerSession() = default;
  // Queues a message to the worker; never blocks. Ignored once closed.
  virtual void Send(const cluster::CoordinatorMessage& message) = 0;
  // Ends the stream with `status` (the worker sees it as the RPC's status).
  virtual void Close(const absl::Status& status) = 0;
};

struct ClusterOptions {
  // Workers of the whole cluster; with `instances` > 1 they are split evenly
  // into that many instances (each placed by the layout rules on its own).
  int expected_workers = 1;
  int instances = 1;
  // Where requests go among the instances (router.h).
  RouterPolicy router = RouterPolicy::kCacheAware;
  // Requests of an instance that fails or is drained continue on another
  // one (or on the same one once it re-formed) instead of failing; a request
  // waits at most this long for an instance to take it. flotilla-coordinator
  // turns it on with several instances (--migrate-requests auto).
  bool migrate_requests = false;
  absl::Duration migration_wait = absl::Seconds(30);
  // Time for liveness and metrics; tests inject a simulated clock.
  Clock* clock = Clock::Real();
  LayoutRequest layout;
  std::string model_path;
  ModelConfig model;
  cluster::CommBackend comm_backend = cluster::COMM_BACKEND_UCX;  // host communicator, W > 1
  absl::Duration heartbeat_interval = absl::Milliseconds(250);
  absl::Duration heartbeat_timeout = absl::Seconds(2);  // silence after which a worker is dead
  int max_inflight_requests = 1024;     // beyond: RESOURCE_EXHAUSTED
  // Sized for a GPU: continuous batching of up to 256 sequences, prompt
  // chunks within 2048 tokens per step.
  uint32_t max_batch_tokens = 2048;
  uint32_t max_sequences = 256;
  // How a worker splits a step's budget among prompts (worker/prefill_policy.h).
  cluster::SchedulerPolicy scheduler_policy;
  uint32_t max_model_len = 0;  // 0 = the model's max_position_embeddings
  uint32_t kv_blocks = 0;
  // --kv-cache-dtype passed to every worker (auto: the worker's own flag).
  std::string kv_cache_dtype = "auto";
  // --moe-activation passed to every worker (auto: the worker's own flag).
  std::string moe_activation = "auto";
  // Requests whose prompt logits (prompt tokens x vocab x 4 bytes) exceed
  // this are refused with INVALID_ARGUMENT before any work.
  uint64_t max_prompt_logits_bytes = uint64_t{1} << 30;
  // Expert balancing (cluster_manager_experts.cc).
  uint32_t redundant_experts = 0;            // spare expert slots per layer on every rank
  absl::Duration expert_window = absl::Seconds(10);  // default load window
  absl::Duration rebalance_interval = absl::ZeroDuration();  // automatic rebalancing; 0 = off
  double rebalance_min_imbalance = 1.25;     // automatic: act only above this
  uint64_t rebalance_max_bytes = 0;          // per rebalance; 0 = no bound
  absl::Duration expert_map_prepare_timeout = absl::Seconds(120);
  // A dead worker holding no rank is forgotten (gone from GetStatus) after
  // this long, so restarts under fresh ids do not pile up.
  absl::Duration forget_dead_workers_after = absl::Seconds(60);
};

// The Cancel reason of a request whose answer hit a stop string (the
// metrics count it as stopped, not cancelled).
inline constexpr char kStopStringCancel[] = "a stop string was generated";

// Callbacks of one request. `on_update` gets every SequenceUpdate (the last
// one has a finish reason); `on_done` is called exactly once, after the last
// update, with OK or the error that ended the request. Both are called without
// the manager's lock held, possibly from the manager's threads.
struct RequestCallbacks {
  std::function<void(const cluster::SequenceUpdate&)> on_update;
  std::function<void(const absl::Status&)> on_done;
  // Called once inside Submit with the request's id, before any update can
  // arrive (e.g. to make the id cancellable before the client sees it).
  std::function<void(uint64_t)> on_accepted = nullptr;
};

}  // namespace flotilla::coordinator
