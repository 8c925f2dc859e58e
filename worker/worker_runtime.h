// The worker process: one Session stream with the coordinator (ControlActor
// part: reader, heartbeats) and the engine loop (EngineActor part: shards,
// communicator, KV cache, lockstep step loop, continuous batching on DP-group
// leaders). The engine loop owns all engine state; the reader thread only
// posts messages to its mailbox.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "comm/communicator.h"
#include "common/parallel_config.h"
#include "common/tls_credentials.h"
#include "kernels/cpu/thread_pool.h"
#include "proto/cluster.grpc.pb.h"
#include "worker/engine/cpu_engine.h"
#include "worker/engine/engine.h"
#include "worker/engine/sampler.h"
#include "worker/model/model_source.h"
#include "worker/parallel/parallel_context.h"

namespace flotilla::comm {
class UcxWorker;
}

namespace flotilla::worker {

struct WorkerOptions {
  std::string coordinator = "127.0.0.1:50051";
  std::string worker_id;   // stable across restarts; default host-pid
  std::string node;        // default: the host name
  int threads = 0;         // CPU threads for the engine (0 = all cores)
  int64_t kv_tokens = 65536;  // KV capacity (tokens over all sequences) when the coordinator leaves it to us
  int64_t kv_block_size = 16;
  // "cpu" (the reference engine) or "cuda" (one GPU holds the whole model:
  // an instance of one worker).
  std::string device = "cpu";
  int cuda_device = 0;
  // --device cuda: the fraction of the GPU's memory this worker may use in
  // all (weights, workspaces, KV cache); the KV arena gets what is left.
  double gpu_memory_utilization = 0.90;
  // Share the KV blocks of identical prompt prefixes between requests.
  bool prefix_cache = true;
  absl::Duration comm_timeout = absl::Seconds(10);
  absl::Duration connect_timeout = absl::Seconds(30);
  // Sent in the Session call's metadata; the coordinator may require it.
  std::string cluster_token;
  // The address peers reach this worker at; its interface is the only one
  // the peer (UCX) listeners use. Empty = the address toward the coordinator.
  std::string advertise_address;
  // TLS to the coordinator: tls.ca verifies it; tls.cert/tls.key are this
  // worker's client certificate (the coordinator's --tls-client-ca). Empty: plaintext.
  TlsClientFiles tls;
};

class WorkerRuntime {
 public:
  static absl::StatusOr<std::unique_ptr<WorkerRuntime>> Create(WorkerOptions options);
  ~WorkerRuntime();

  // Connects, serves until the coordinator ends the session or Stop() is
  // called. Returns why it ended.
  absl::Status Run();
  void Stop();

 private:
  explicit WorkerRuntime(WorkerOptions options);

  struct Sequence {
    uint64_t request_id = 0;
    int64_t engine_id = -1;          // on every rank of the group
    std::vector<int32_t> prompt;
    int64_t prefilled = 0;
    bool started = false;  // its first chunk was planned
    std::vector<int32_t> generated;
    std::unique_ptr<Sampler> sampler;
    int64_t max_new = 0;
    std::vector<int> stop_ids;
    bool want_logprobs = false;
    bool return_prompt_logits = false;
    int64_t kv_reserved = 0;
    uint64_t deadline_unix_ms = 0;
  };

  // Queues `m` for the writer thread (never blocks on the stream).
  void Send(cluster::WorkerMessage m);
  void WriterLoop();
  // What the Hello says this worker computes on: its GPU under --device
  // cuda, else the host's cores.
  void DescribeDevice(common::DeviceInfo* device) const;
  void ReaderLoop();
  void HeartbeatLoop();
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
  cluster::StepPlan PlanStep(cluster::TokenBatch* rejected);
  void Admit(const cluster::SubmitSequence& s, cluster::TokenBatch* out);
  // Starts the prompt after its longest cached prefix (none when the request
  // wants every prompt position's logits) and counts the lookup.
  void TakeCachedPrefix(Sequence& seq);
  void FinishSequence(Sequence& seq, common::FinishReason reason, cluster::SequenceUpdate* u);
  // The sampler that draws the item's next token on the engine's device
  // (leader only), or null for a prompt chunk that does not end the prompt.
  Sampler* SamplerFor(const cluster::PlanItem& item);
  // Longest sequence served: the engine's limit within the assignment's
  // max_model_len.
  int64_t MaxSequenceLength() const;

  const WorkerOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<cluster::ClusterControl::Stub> stub_;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<cluster::WorkerMessage, cluster::CoordinatorMessage>>
      stream_;
  std::mutex outbox_mu_;
  std::condition_variable outbox_cv_;
  std::deque<cluster::WorkerMessage> outbox_;
  bool writer_done_ = false;  // under outbox_mu_

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<cluster::CoordinatorMessage> mailbox_;
  std::atomic<bool> stop_{false};
  std::atomic<uint32_t> heartbeat_ms_{250};
  absl::Status end_status_;

  // Engine state: touched only by the engine loop.
  std::unique_ptr<kernels::cpu::ThreadPool> pool_;
  std::unique_ptr<ModelSource> model_;  // the assignment's --model: a checkpoint or synthetic
  std::optional<cluster::Assignment> assignment_;
  std::optional<ParallelConfig> parallel_;
  std::unique_ptr<comm::UcxWorker> ucx_endpoint_;
  std::string ucx_net_device_;  // the advertised address's interface, set by Run
  std::unique_ptr<comm::Communicator> comm_;
  // W > 1: the layer exchanges (host memory over comm_ for CPU ranks, device
  // memory for GPU ranks, comm_ only bootstrapping them). Outlives engine_.
  std::unique_ptr<parallel::ParallelContext> parallel_context_;
  std::unique_ptr<Engine> engine_;
  std::optional<ModelWeights> pending_weights_;  // loaded, waiting for StartComm
  bool running_ = false;
  uint64_t steps_ = 0;
  int64_t idle_sleep_us_ = 100;
  // Expert maps received but not yet in use, by version; every rank switches
  // to version v at the first step where all ranks have it.
  std::map<uint64_t, ExpertMap> pending_maps_;
  uint64_t map_version_ = 0;
  // Leader state.
  std::deque<cluster::SubmitSequence> pending_;
  std::map<uint64_t, Sequence> sequences_;  // running, by request id
  std::vector<uint64_t> to_free_;
  int64_t kv_reserved_ = 0;
  // Every rank: request id -> engine sequence id.
  std::map<uint64_t, int64_t> engine_ids_;
  std::atomic<uint32_t> running_count_{0}, queued_count_{0};
  std::atomic<uint64_t> kv_free_{0}, kv_total_{0};
  std::atomic<uint64_t> prefix_queries_{0}, prefix_hits_{0};  // tokens
};

}  // namespace flotilla::worker
