#include "tools/cli/soak_command.h"

#include <signal.h>

#include <atomic>
#include <iostream>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tools/cli/local_cluster.h"
#include "tools/cli/process_probe.h"
#include "tools/cli/soak_workload.h"
#include "tools/cli/tls_flags.h"

namespace flotilla::cli {
namespace {

struct SoakFlags {
  std::string coordinator;  // empty: start a local cluster
  int up_pid = 0;  // a running `flotilla up`: its workers are killed, its coordinator watched
  int workers = 2;
  int instances = 1;
  std::string model;
  std::string log_dir;
  double duration_s = 120;
  double kill_every_s = 40;  // 0: no kills
  double report_every_s = 10;
  double hang_after_s = 30;
  int concurrency = 8;
  int max_tokens = 64;
  int vocab = 1024;
  uint64_t seed = 1;
  std::string api_key;
  TlsClientFiles tls;
};

// The processes the soak kills and watches: its own cluster's, or those of a
// `flotilla up` found through /proc.
class SoakTargets {
 public:
  SoakTargets(LocalCluster* own, pid_t up_pid) : own_(own), up_pid_(up_pid) {}

  pid_t coordinator() const {
    if (own_) return own_->coordinator_pid();
    if (up_pid_ <= 0) return -1;
    std::vector<pid_t> found = ChildrenNamed(up_pid_, "flotilla-coordinator");
    return found.empty() ? -1 : found.front();
  }
  // Kills the next worker (round robin) with SIGKILL; false when there is none.
  bool KillNextWorker() {
    std::vector<pid_t> workers;
    if (own_) {
      for (int i = 0; i < own_workers_; ++i) workers.push_back(own_->worker_pid(i));
    } else if (up_pid_ > 0) {
      workers = ChildrenNamed(up_pid_, "flotilla-worker");
    }
    if (workers.empty()) return false;
    const pid_t victim = workers[next_++ % workers.size()];
    return victim > 0 && kill(victim, SIGKILL) == 0;
  }
  void set_own_workers(int n) { own_workers_ = n; }

 private:
  LocalCluster* own_;
  pid_t up_pid_;
  int own_workers_ = 0;
  size_t next_ = 0;
};

struct SoakState {
  std::mutex mu;
  SoakTally tally;
  int kills = 0;
  std::atomic<bool> done{false};
  std::string fatal;  // why the cluster could not go on (own cluster)
};

void ClientLoop(const SoakFlags& f, client::Client& client, uint64_t seed, absl::Time end,
                SoakState& state) {
  std::mt19937_64 rng(seed);
  SoakRequestOptions options;
  options.vocab = f.vocab;
  options.max_tokens = f.max_tokens;
  while (absl::Now() < end && !state.done) {
    SoakTally one;
    RunSoakRequest(client, DrawSoakKind(rng), options, rng, &one);
    {
      std::lock_guard<std::mutex> lock(state.mu);
      state.tally.Add(one);
    }
    // Refused while a worker restarts: pause as a client would, rather than
    // count thousands of refusals a second.
    if (one.failed_total() > 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

// Restarts what exits (own cluster) and kills a worker every kill_every_s
// until `end`; it goes on restarting until the clients' last requests ended,
// so a kill near the end is recovered from as any other.
void ChaosLoop(const SoakFlags& f, LocalCluster* own, SoakTargets& targets, absl::Time end,
               SoakState& state) {
  absl::Time next_kill =
      f.kill_every_s > 0 ? absl::Now() + absl::Seconds(f.kill_every_s) : absl::InfiniteFuture();
  while (!state.done) {
    if (own) {
      absl::Status supervised = own->Supervise();
      if (!supervised.ok()) {
        std::lock_guard<std::mutex> lock(state.mu);
        state.fatal = std::string(supervised.message());
        state.done = true;
        return;
      }
    }
    if (absl::Now() >= next_kill && absl::Now() < end) {
      next_kill += absl::Seconds(f.kill_every_s);
      if (targets.KillNextWorker()) {
        std::lock_guard<std::mutex> lock(state.mu);
        ++state.kills;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

nlohmann::json Report(SoakState& state, const SoakTargets& targets, absl::Time start,
                      std::optional<ProcessSample>& baseline) {
  nlohmann::json line;
  {
    std::lock_guard<std::mutex> lock(state.mu);
    line = state.tally.ToJson();
    line["kills"] = state.kills;
  }
  line["elapsed_s"] = absl::ToInt64Seconds(absl::Now() - start);
  const pid_t coordinator = targets.coordinator();
  std::optional<ProcessSample> now = coordinator > 0 ? SampleProcess(coordinator) : std::nullopt;
  if (now) {
    if (!baseline) baseline = now;
    line["coordinator_rss_kb"] = now->rss_kb;
    line["coordinator_fds"] = now->open_fds;
    line["coordinator_rss_growth_kb"] = now->rss_kb - baseline->rss_kb;
    line["coordinator_fd_growth"] = now->open_fds - baseline->open_fds;
  }
  return line;
}

int RunSoak(const SoakFlags& f) {
  std::unique_ptr<LocalCluster> own;
  std::string address = f.coordinator;
  if (address.empty()) {
    LocalClusterOptions o;
    o.workers = f.workers;
    o.instances = f.instances;
    o.model = f.model;
    o.log_dir = f.log_dir;
    absl::StatusOr<std::unique_ptr<LocalCluster>> started = LocalCluster::Start(o);
    if (!started.ok()) {
      std::cerr << "flotilla bench soak: " << started.status().message() << "\n";
      return 1;
    }
    own = *std::move(started);
    address = own->address();
  } else if (f.up_pid <= 0) {
    std::cerr << "flotilla bench soak: no --up-pid: no worker kills, no coordinator figures\n";
  }
  SoakTargets targets(own.get(), f.up_pid);
  targets.set_own_workers(f.workers);
  client::ClientOptions co;
  co.address = address;
  co.deadline = absl::Seconds(f.hang_after_s);
  co.max_attempts = 1;  // every outcome counts as it is
  co.api_key = f.api_key;
  co.tls = f.tls;
  absl::StatusOr<std::unique_ptr<client::Client>> client = client::Client::Create(co);
  if (!client.ok()) {
    std::cerr << "flotilla bench soak: " << client.status().message() << "\n";
    return 1;
  }
  SoakState state;
  const absl::Time start = absl::Now();
  const absl::Time end = start + absl::Seconds(f.duration_s);
  std::vector<std::thread> threads;
  for (int i = 0; i < f.concurrency; ++i) {
    threads.emplace_back([&, i] { ClientLoop(f, **client, f.seed + i, end, state); });
  }
  std::thread chaos([&] { ChaosLoop(f, own.get(), targets, end, state); });
  std::optional<ProcessSample> baseline;
  // A line every report_every_s while the load runs; the final one follows.
  while (!state.done) {
    const absl::Duration left = end - absl::Now();
    if (left <= absl::ZeroDuration()) break;
    std::this_thread::sleep_for(
        absl::ToChronoMilliseconds(std::min(absl::Seconds(f.report_every_s), left)));
    if (absl::Now() < end) std::cout << Report(state, targets, start, baseline).dump() << std::endl;
  }
  for (std::thread& t : threads) t.join();
  state.done = true;
  chaos.join();
  nlohmann::json last = Report(state, targets, start, baseline);
  last["final"] = true;
  if (!state.fatal.empty()) last["fatal"] = state.fatal;
  std::cout << last.dump() << std::endl;
  const bool kept =
      last["lost"] == 0 && last["hung"] == 0 && last["wrong"] == 0 && state.fatal.empty();
  return kept ? 0 : 1;
}

}  // namespace

void AddSoakCommand(CLI::App& bench) {
  auto f = std::make_shared<SoakFlags>();
  CLI::App* soak = bench.add_subcommand(
      "soak",
      "Bounded soak: streams, cancels, malformed requests and worker kills; JSON lines "
      "with lost/hung/failed counts and the coordinator's memory and descriptors");
  soak->add_option("--coordinator", f->coordinator,
                   "HOST:PORT of a running cluster (default: start one with --workers)");
  soak->add_option("--up-pid", f->up_pid,
                   "pid of the `flotilla up` serving --coordinator: its workers are killed and "
                   "its coordinator watched");
  soak->add_option("--workers", f->workers, "workers of the cluster it starts")
      ->check(CLI::Range(1, 16))
      ->capture_default_str();
  soak->add_option("--instances", f->instances,
                   "model instances of the cluster it starts (--workers a multiple of it)")
      ->check(CLI::Range(1, 16))
      ->capture_default_str();
  soak->add_option("--model", f->model, "model of the cluster it starts (default: built-in)");
  soak->add_option("--log-dir", f->log_dir, "logs of the cluster it starts (default: stderr)");
  soak->add_option("--duration", f->duration_s, "seconds of load")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  soak->add_option("--kill-every", f->kill_every_s, "seconds between worker kills (0 = none)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  soak->add_option("--report-every", f->report_every_s, "seconds between JSON lines")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  soak->add_option("--hang-after", f->hang_after_s,
                   "a request not ended after this many seconds counts as hung")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  soak->add_option("--concurrency", f->concurrency, "client threads")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  soak->add_option("--max-tokens", f->max_tokens, "longest output asked for")
      ->check(CLI::Range(1, 1 << 16))
      ->capture_default_str();
  soak->add_option("--vocab", f->vocab, "prompt ids are drawn below this")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  soak->add_option("--seed", f->seed, "random seed")->capture_default_str();
  soak->add_option("--api-key", f->api_key, "API key")->envname("FLOTILLA_API_KEY");
  AddClientTlsFlags(soak, &f->tls);
  soak->callback([f] {
    const int rc = RunSoak(*f);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace flotilla::cli
