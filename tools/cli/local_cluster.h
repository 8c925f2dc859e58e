// A local cluster: one flotilla-coordinator and N flotilla-worker processes on
// this machine, started as children and stopped (all of them) on Stop() or
// destruction. Used by `flotilla up`, the demo and end-to-end tests.
#pragma once

#include <sys/types.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/tls_credentials.h"
#include "tools/cli/child_output.h"

namespace flotilla::cli {

struct LocalClusterOptions {
  std::string model;          // checkpoint dir or synthetic:PRESET[:SEED]; empty = built-in
  int workers = 1;
  int instances = 1;          // model instances the workers form (coordinator --instances)
  std::string router;            // coordinator --router; empty = its default
  std::string migrate_requests;  // coordinator --migrate-requests; empty = its default
  std::string moe_parallel;      // coordinator --moe-parallel; empty = its default (auto)
  int tp = 0;                 // 0 = automatic
  std::string device_transport = "auto";  // between GPU workers: auto, cuda-ipc or nccl
  int threads_per_worker = 0; // 0 = cores / workers
  std::string device = "cpu"; // workers' engine: cpu or cuda
  // --device cuda: the GPU ordinals the workers go on, worker i on
  // gpus[i % gpus.size()]; empty = every visible GPU.
  std::vector<int> gpus;
  bool prefix_cache = true;   // workers share KV blocks of identical prompt prefixes
  std::string listen = "127.0.0.1:0";
  std::string http_listen = "127.0.0.1:0";  // the OpenAI-compatible HTTP API; empty = off
  // The coordinator's --api-key-file and --admin-key-file (empty = none). The
  // cluster's own readiness check presents the first admin (else client) key.
  std::string api_key_file;
  std::string admin_key_file;
  // The coordinator's --served-model-name: names requests may use for the
  // model (the first is the one replies carry); empty = the model id alone.
  std::vector<std::string> served_model_names;
  int heartbeat_timeout_ms = 2000;
  int comm_timeout_ms = 10000;
  std::string bin_dir;        // where flotilla-coordinator/-worker live; empty = find them
  std::string log_dir;        // children's logs; empty = inherit stderr
  // The children's --log-level and --log-format (empty: their defaults); each
  // gets --log-tag coordinator or worker-N. Under "json" without `log_dir`,
  // their output reaches this process's stderr as JSON lines only.
  std::string log_level;
  std::string log_format;
  absl::Duration ready_timeout = absl::Seconds(120);
  // Further flags for the coordinator and for every worker (e.g.
  // {"--max-sequences", "256"}, {"--gpu-memory-utilization", "0.9"}).
  std::vector<std::string> coordinator_args;
  std::vector<std::string> worker_args;
  // --device cuda: the fraction of each GPU the workers on it may use
  // together; each of k workers sharing a GPU gets 1/k of it (its
  // --gpu-memory-utilization) and, under the MPS daemon, 1/k of its SMs
  // (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, unless set already), so ranks that
  // spin-wait on each other never starve each other of SMs.
  double gpu_memory_utilization = 0.90;
  // TLS: the coordinator's certificate, key and (mTLS) client CA; the CA the
  // workers and this process verify it with, and the workers' client
  // certificate. Empty: plaintext.
  TlsServerFiles tls;
  TlsClientFiles client_tls;
  // Polled while Start waits (for ports, for readiness): true ends the wait
  // with CANCELLED (Ctrl-C) and the children are stopped.
  std::function<bool()> interrupted;
  // Told what the cluster is doing while Start waits (state changes, and a
  // line every 10 s while loading) and what supervision does.
  std::function<void(const std::string&)> progress;
};

// How Supervise restarts workers that exit.
struct RestartPolicy {
  absl::Duration first_backoff = absl::Milliseconds(200);
  absl::Duration max_backoff = absl::Seconds(5);
  // A worker that ran this long starts its backoff over.
  absl::Duration healthy_after = absl::Seconds(30);
  // Give up after this many exits in a row, each within `healthy_after` of
  // its start (e.g. a flag it refuses).
  int max_quick_exits = 5;
};

class LocalCluster {
 public:
  static absl::StatusOr<std::unique_ptr<LocalCluster>> Start(const LocalClusterOptions& options);
  ~LocalCluster();

  const std::string& address() const { return address_; }
  // host:port of the HTTP API (empty when it is off).
  const std::string& http_address() const { return http_address_; }
  const std::string& model() const { return model_; }
  // What requests give as "model": the first --served-model-name, else the
  // model's default id (the coordinator's rule).
  std::string model_id() const;
  // --device cuda: the GPU ordinal of each worker (empty on the CPU).
  const std::vector<int>& worker_gpus() const { return worker_gpus_; }
  // The file holding this cluster's random token (0600, in a directory only
  // this user can enter; removed by Stop()).
  const std::string& cluster_token_file() const { return cluster_token_file_; }
  // Process id of worker `i` (-1 when it is not running).
  pid_t worker_pid(int i) const { return workers_.at(static_cast<size_t>(i)); }
  // The coordinator's process id (tests read its memory use); -1 once it ended.
  pid_t coordinator_pid() const { return coordinator_; }
  // Kills worker `i` with SIGKILL (tests) / restarts it with the same id.
  absl::Status KillWorker(int i);
  absl::Status RestartWorker(int i);
  // Whether every child is still running; names the first that is not.
  absl::Status CheckAlive();
  // One round of supervision (call it often): reaps exited workers and
  // restarts each after its backoff. Not OK when the coordinator is gone
  // (how it ended) or a worker keeps exiting at start: then stop everything.
  absl::Status Supervise(const RestartPolicy& policy = RestartPolicy());
  // The coordinator's graceful stop: SIGTERM to it alone (it refuses new
  // requests and lets those in flight finish for up to its --drain-timeout),
  // waiting up to `timeout` for it to exit; once `stop_now()` turns true a
  // second SIGTERM makes it stop at once. Then Stop() for the rest.
  void Drain(absl::Duration timeout, const std::function<bool()>& stop_now);
  // SIGTERM to every child, then SIGKILL after `grace`; waits for all.
  void Stop(absl::Duration grace = absl::Seconds(5));
  // Kills the coordinator with SIGKILL / starts it again on the same ports (tests).
  absl::Status KillCoordinator();
  absl::Status RestartCoordinator();

 private:
  LocalCluster() = default;
  // Starts argv[0] with this process's environment plus `env` ("NAME=value",
  // overriding), its output appended to `log` (empty: inherited).
  absl::StatusOr<pid_t> Spawn(const std::vector<std::string>& argv, const std::string& log,
                              const std::vector<std::string>& env = {});
  absl::Status WaitReady(absl::Duration timeout);
  // Waits for the coordinator to write its port files.
  absl::Status WaitListening(const std::string& port_file, const std::string& http_port_file,
                             std::string* port, std::string* http_port);
  void Progress(const std::string& line) const;
  bool Interrupted() const;
  // Reaped worker `i`: when to start it again.
  void ScheduleRestart(size_t i, int status, const RestartPolicy& policy);
  // A fresh random cluster token in a private directory, for the children.
  absl::Status WriteClusterToken();

  LocalClusterOptions options_;
  std::string key_;  // presented by WaitReady; empty = none
  std::string coordinator_bin_, worker_bin_, model_, address_, http_address_;
  std::string secret_dir_, cluster_token_file_;
  pid_t coordinator_ = -1;
  std::vector<pid_t> workers_;
  std::vector<int> worker_gpus_;
  std::vector<std::vector<std::string>> worker_argv_;
  std::vector<std::vector<std::string>> worker_env_;
  std::vector<std::string> coordinator_argv_;  // with fixed ports once listening
  // Supervision of each worker: when it started, when to start it again
  // (InfiniteFuture: not scheduled), its backoff and quick exits in a row.
  struct WorkerLife {
    absl::Time started;
    absl::Time restart_at = absl::InfiniteFuture();
    absl::Duration backoff;
    int quick_exits = 0;
  };
  std::vector<WorkerLife> lives_;
  // Under JSON logs (and no --log-dir): each child's output, passed on.
  std::vector<std::unique_ptr<ChildOutput>> outputs_;
};

// "exit status 2", "killed by signal 9": how a child ended (waitpid status).
std::string DescribeExit(int status);

// The built-in default model: a deterministic synthetic tiny gpt-oss with the
// real o200k_harmony vocabulary, written once into the cache directory.
absl::StatusOr<std::string> EnsureDefaultModel();

// Directory holding the running `flotilla` binary.
std::string SelfDir();

}  // namespace flotilla::cli
