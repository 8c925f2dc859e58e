// The worker process: the composition of its parts. A CoordinatorClient
// (ControlSession: the Session stream, its writer, reader and heartbeat
// threads) delivers the coordinator's messages to the engine loop, which
// owns everything else: the assignment's shards, the peer communicator, the
// engine an EngineFactory builds for the device, the leader's Scheduler and
// the StepExecutor that runs each lockstep step.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
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
#include "worker/engine_probe.h"
#include "worker/expert_store.h"
#include "worker/model/model_source.h"
#include "worker/peer_endpoint.h"
#include "worker/scheduler.h"
#include "worker/step_executor.h"
#include "worker/step_profile.h"
#include "worker/worker_options.h"

namespace flotilla::worker {

class WorkerRuntime {
 public:
  // A new client for each session (nullptr: no more sessions).
  using ClientFactory = std::function<std::unique_ptr<CoordinatorClient>()>;

  // A worker talking to options.coordinator over gRPC, with the engines of this build.
  static absl::StatusOr<std::unique_ptr<WorkerRuntime>> Create(WorkerOptions options);
  // The same over `client` for one session, building engines with
  // `factories` and opening peer endpoints with `peers` (tests: fakes).
  static absl::StatusOr<std::unique_ptr<WorkerRuntime>> Create(
      WorkerOptions options, std::unique_ptr<CoordinatorClient> client, EngineFactories factories,
      PeerEndpointFactory peers = OpenPeerEndpoint);
  // Sessions from `clients`, reconnecting as Run describes.
  static absl::StatusOr<std::unique_ptr<WorkerRuntime>> Create(
      WorkerOptions options, ClientFactory clients, EngineFactories factories,
      PeerEndpointFactory peers = OpenPeerEndpoint);
  ~WorkerRuntime();

  // Serves sessions with the coordinator until Stop() (or a Shutdown message):
  // when a session cannot start or ends (the coordinator is not up yet, was
  // restarted, or dropped this worker), the worker drops its engine state and
  // opens a new one after a backoff (options.reconnect_backoff doubling up
  // to options.reconnect_backoff_max). Returns OK after Stop, or the error
  // that retrying cannot mend (a refused cluster token, a bad request).
  absl::Status Run();
  // Safe from any thread.
  void Stop();

 private:
  WorkerRuntime(WorkerOptions options, ClientFactory clients, EngineFactories factories,
                PeerEndpointFactory peers);

  // One session over `client`: connect, open, the engine loop; returns why it ended.
  absl::Status RunSession(std::unique_ptr<CoordinatorClient> client);
  // Sleeps `wait`, less when Stop() is called.
  void SleepUnlessStopped(absl::Duration wait);
  // On the client's thread: a DropGeneration interrupts the current
  // generation's collectives.
  void OnUrgent(const cluster::CoordinatorMessage& m);
  // A request arrived while there is no engine to run it: it ends at once.
  void RefuseSubmit(const cluster::SubmitSequence& submit);

  cluster::WorkerMessage MakeHello() const;
  void ReportLoad(cluster::WorkerLoad* load) const;
  void EngineLoop();
  void Handle(const cluster::CoordinatorMessage& m);
  // Engine measurements (worker_measure.cc). An instance of one rank times
  // its engine at once, between steps (serving pauses), with temporary
  // sequences; a sharded one queues the request until every rank has it
  // (agreed in the plan exchange) and then all ranks run the same probe in
  // lockstep after that step.
  void HandleMeasure(const cluster::MeasureEngine& m);
  cluster::WorkerMessage AnswerMeasurement(const cluster::MeasureEngine& m);
  // The answer to `m`: `got` (or its error) and who measured.
  cluster::WorkerMessage MeasurementAnswer(const cluster::MeasureEngine& m,
                                           absl::StatusOr<cluster::EngineMeasurement> got);
  // Runs and answers the oldest queued measurement, which every rank agreed
  // on at this step. An error means the ranks lost their lockstep (a peer
  // failed mid-probe): the caller handles it as a failed step.
  absl::Status MeasureInLockstep();
  // What the probe may use of this rank's engine beside its running requests.
  ProbeLimits LocalProbeLimits() const;
  void Reset(const std::string& why);
  // Ends every request this worker holds (running or queued) with `why`, so
  // that no client waits for a sequence the worker is about to drop.
  void FailRequests(const absl::Status& why);
  absl::Status Load(const cluster::Assignment& a);
  absl::Status StartComm(const cluster::StartComm& sc);
  // A leader's EAGLE3 head (the coordinator's --speculative-model, else the
  // worker's): loaded once per spec into draft_memory_, and the engine set to
  // return the hidden states of its layers; none when neither names one.
  absl::Status SetUpDraftHead(const cluster::Assignment& a, const ModelWeights& host,
                              Engine* engine);
  // One lockstep iteration; false when the whole instance was idle.
  absl::StatusOr<bool> StepOnce();
  // The engine step of an exchanged plan with work, and its tokens sent.
  absl::StatusOr<bool> RunStep(const StepExecutor::Exchanged& exchanged);
  void SendUpdates(cluster::TokenBatch batch);
  // DP-group leaders: the prefix cache's changes since the last call as
  // KvEvents (bounded: kv_events_report.h), for the coordinator's router.
  void SendKvEvents();
  // The scheduler's figures for the heartbeat (read by the client's thread);
  // reported at once when the worker turns busy (a sequence queued or
  // running) or idle.
  void PublishLoad();

  // Expert balancing (worker_experts.cc): the phases of an expert-map
  // change, the store's finished loads, and the engine's expert counts sent
  // to the coordinator about every kExpertLoadInterval.
  void HandleExpertMap(const cluster::ExpertMapUpdate& update);
  void PollExpertStore();
  void CollectExpertCounts();
  void MaybeSendExpertLoad(bool force);

  const WorkerOptions options_;
  const ClientFactory clients_;
  const EngineFactories factories_;
  const PeerEndpointFactory peers_;
  EngineFactory* factory_ = nullptr;  // options_.device's
  std::atomic<bool> stop_{false};
  std::mutex stop_mu_;  // guards client_ against Stop() from other threads
  std::condition_variable stop_cv_;
  std::unique_ptr<CoordinatorClient> client_;  // the current session's (engine loop)

  // The current generation's interrupt, raised by OnUrgent.
  std::mutex interrupt_mu_;
  std::shared_ptr<std::atomic<bool>> interrupt_;
  uint64_t interrupt_generation_ = 0;

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
  // What drafters remember across requests (suffix decoding's recent
  // outputs, replay's recordings); outlives each assignment's scheduler.
  DraftMemory draft_memory_;
  std::string draft_head_spec_;                  // what draft_memory_.eagle3 was loaded from
  std::unique_ptr<Scheduler> scheduler_;         // while running (used on leaders)
  std::unique_ptr<StepExecutor> executor_;       // while running
  std::unique_ptr<ExpertStore> expert_store_;    // while running
  // Measurements a sharded instance was asked for, oldest first, not yet
  // agreed by every rank.
  std::deque<cluster::MeasureEngine> pending_measures_;
  // Expert rows counted under map version expert_load_version_, not yet sent.
  std::vector<uint64_t> expert_load_;
  uint64_t expert_load_version_ = 0;
  int64_t last_expert_load_ms_ = 0;
  int64_t last_expert_counts_ms_ = 0;  // CollectExpertCounts' last read
  int64_t idle_sleep_us_ = 100;
  StepProfile step_profile_{options_.step_profile_steps};

  std::atomic<uint32_t> running_count_{0}, queued_count_{0};
  std::atomic<uint64_t> kv_free_{0}, kv_total_{0};
  std::atomic<uint64_t> prefix_queries_{0}, prefix_hits_{0};  // tokens
  // The engine's host KV tier: blocks copied back, bytes to the host and back.
  std::atomic<uint64_t> host_hits_{0}, host_to_host_{0}, host_to_device_{0};
  // Speculative decoding: drafted and accepted tokens, verification steps.
  std::atomic<uint64_t> spec_drafted_{0}, spec_accepted_{0}, spec_verify_steps_{0};
  std::atomic<uint64_t> steps_{0};
  bool busy_ = false;  // as of the last PublishLoad (engine loop only)
  // What the schedulers of earlier generations counted.
  uint64_t prefix_queries_base_ = 0, prefix_hits_base_ = 0;
  KvHostTierStats host_base_;  // what the engines of earlier generations counted
  SpeculativeCounts spec_base_;
};

}  // namespace flotilla::worker
