// The worker process: the composition of its parts. A CoordinatorClient
// (ControlSession: the Session stream, its writer, reader and heartbeat
// threads) delivers the coordinator's messages to the engine loop, which
// owns everything else: the assignment's shards, the peer communicator, the
// engine an EngineFactory builds for the device, the leader's Scheduler and
// the StepExecutor that runs each lockstep step.
#pragma once

#include <atomic>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "comm/communicator.h"
#include "common/parallel_config.h"
#include "kernels/cpu/thread_pool.h"
#include "proto/cluster.pb.h"
#include "worker/coordinator_client.h"
#include "worker/engine/engine.h"
#include "worker/engine_factory.h"
#include "worker/expert_store.h"
#include "worker/model/model_source.h"
#include "worker/peer_endpoint.h"
#include "worker/scheduler.h"
#include "worker/step_executor.h"
#include "worker/worker_options.h"

namespace flotilla::worker {

class WorkerRuntime {
 public:
  // A worker talking to options.coordinator over gRPC, with the engines of this build.
  static absl::StatusOr<std::unique_ptr<WorkerRuntime>> Create(WorkerOptions options);
  // The same over `client`, building engines with `factories` (tests: fakes).
  static absl::StatusOr<std::unique_ptr<WorkerRuntime>> Create(
      WorkerOptions options, std::unique_ptr<CoordinatorClient> client, EngineFactories factories);
  ~WorkerRuntime();

  // Connects, serves until the coordinator ends the session or Stop() is
  // called. Returns why it ended.
  absl::Status Run();
  // Safe from any thread.
  void Stop();

 private:
  WorkerRuntime(WorkerOptions options, std::unique_ptr<CoordinatorClient> client,
                EngineFactories factories);

  cluster::WorkerMessage MakeHello() const;
  void ReportLoad(cluster::WorkerLoad* load) const;
  void EngineLoop();
  void Handle(const cluster::CoordinatorMessage& m);
  // Times the engine between steps (serving pauses) with temporary sequences.
  cluster::WorkerMessage AnswerMeasurement(const cluster::MeasureEngine& m);
  void Reset(const std::string& why);
  // Ends every request this worker holds (running or queued) with `why`, so
  // that no client waits for a sequence the worker is about to drop.
  void FailRequests(const absl::Status& why);
  absl::Status Load(const cluster::Assignment& a);
  absl::Status StartComm(const cluster::StartComm& sc);
  // One lockstep iteration; false when the whole instance was idle.
  absl::StatusOr<bool> StepOnce();
  void SendUpdates(cluster::TokenBatch batch);
  // The scheduler's figures for the heartbeat (read by the client's thread).
  void PublishLoad();

  // Expert balancing (worker_experts.cc): the phases of an expert-map
  // change, the store's finished loads, and the engine's expert counts sent
  // to the coordinator about every kExpertLoadInterval.
  void HandleExpertMap(const cluster::ExpertMapUpdate& update);
  void PollExpertStore();
  void CollectExpertCounts();
  void MaybeSendExpertLoad(bool force);

  const WorkerOptions options_;
  const std::unique_ptr<CoordinatorClient> client_;
  const EngineFactories factories_;
  EngineFactory* factory_ = nullptr;  // options_.device's
  std::atomic<bool> stop_{false};

  // Engine state: touched only by the engine loop.
  std::unique_ptr<kernels::cpu::ThreadPool> pool_;
  std::unique_ptr<ModelSource> model_;  // the assignment's --model: a checkpoint or synthetic
  std::optional<cluster::Assignment> assignment_;
  std::optional<ParallelConfig> parallel_;
  std::unique_ptr<PeerEndpoint> peer_endpoint_;  // opened at Load, joined at StartComm
  std::string peer_net_device_;                  // the advertised address's interface, set by Run
  std::unique_ptr<comm::Communicator> comm_;
  // The engine and, for W > 1, its parallel context (which outlives it).
  RankEngine rank_engine_;
  std::optional<ModelWeights> pending_weights_;  // loaded, waiting for StartComm
  std::unique_ptr<Scheduler> scheduler_;         // while running (used on leaders)
  std::unique_ptr<StepExecutor> executor_;       // while running
  std::unique_ptr<ExpertStore> expert_store_;    // while running
  // Expert rows counted under map version expert_load_version_, not yet sent.
  std::vector<uint64_t> expert_load_;
  uint64_t expert_load_version_ = 0;
  int64_t last_expert_load_ms_ = 0;
  int64_t idle_sleep_us_ = 100;

  std::atomic<uint32_t> running_count_{0}, queued_count_{0};
  std::atomic<uint64_t> kv_free_{0}, kv_total_{0};
  std::atomic<uint64_t> prefix_queries_{0}, prefix_hits_{0};  // tokens
  std::atomic<uint64_t> steps_{0};
  // What the schedulers of earlier generations counted.
  uint64_t prefix_queries_base_ = 0, prefix_hits_base_ = 0;
};

}  // namespace flotilla::worker
