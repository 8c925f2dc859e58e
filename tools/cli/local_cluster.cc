#include "tools/cli/local_cluster.h"

#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/cluster_token.h"
#include "common/key_file.h"
#include "common/listen_address.h"
#include "common/model_config.h"
#include "common/model_spec.h"
#include "common/status.h"
#include "proto/admin.grpc.pb.h"
#include "tools/checkpoint/synthetic_checkpoint.h"
#include "tools/cli/gpu_assignment.h"

extern char** environ;  // POSIX: the process environment

namespace flotilla::cli {
namespace fs = std::filesystem;

std::string SelfDir() {
  std::error_code ec;
  fs::path p = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string(".") : p.parent_path().string();
}

namespace {

std::string FindBinary(const std::string& name, const std::string& hint) {
  std::vector<fs::path> dirs;
  if (!hint.empty()) dirs.push_back(hint);
  if (const char* env = std::getenv("FLOTILLA_BIN_DIR")) dirs.push_back(env);
  const fs::path self = SelfDir();
  dirs.push_back(self);
  dirs.push_back(self / ".." / "coordinator");
  dirs.push_back(self / ".." / "worker");
  dirs.push_back(self / ".." / "bin");
  for (const fs::path& d : dirs) {
    fs::path p = d / name;
    if (access(p.c_str(), X_OK) == 0) return fs::weakly_canonical(p).string();
  }
  return "";
}

std::string CacheDir() {
  if (const char* c = std::getenv("FLOTILLA_CACHE")) return c;
  if (const char* x = std::getenv("XDG_CACHE_HOME")) return std::string(x) + "/flotilla";
  if (const char* h = std::getenv("HOME")) return std::string(h) + "/.cache/flotilla";
  return "/tmp/flotilla-cache";
}

// The logging flags of a child named `tag`.
std::vector<std::string> LogArgs(const LocalClusterOptions& o, const std::string& tag) {
  std::vector<std::string> args = {"--log-tag", tag};
  if (!o.log_level.empty()) args.insert(args.end(), {"--log-level", o.log_level});
  if (!o.log_format.empty()) args.insert(args.end(), {"--log-format", o.log_format});
  return args;
}

// The --log-tag a child was given ("" when none).
std::string LogTagOf(const std::vector<std::string>& argv) {
  for (size_t i = 0; i + 1 < argv.size(); ++i) {
    if (argv[i] == "--log-tag") return argv[i + 1];
  }
  return "";
}

}  // namespace

absl::StatusOr<std::string> EnsureDefaultModel() {
  ModelConfig c = ModelConfig::Tiny();
  // The real vocabulary and end tokens, so text prompts and Harmony work.
  c.vocab_size = 201088;
  c.eos_token_ids = {200002, 200012};
  c.pad_token_id = 199999;
  const std::string dir = CacheDir() + "/models/synthetic-gpt-oss-tiny-seed7";
  if (fs::exists(fs::path(dir) / "config.json") && fs::exists(fs::path(dir) / "model.safetensors")) {
    return dir;
  }
  const std::string tmp = dir + ".tmp-" + std::to_string(getpid());
  std::error_code ec;
  fs::create_directories(tmp, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", tmp, ": ", ec.message()));
  SyntheticCheckpointOptions o;
  o.seed = 7;
  FLOTILLA_RETURN_IF_ERROR(WriteSyntheticCheckpoint(c, o, tmp));
  fs::remove_all(dir, ec);
  fs::rename(tmp, dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot move ", tmp, " to ", dir));
  return dir;
}

absl::StatusOr<std::unique_ptr<LocalCluster>> LocalCluster::Start(
    const LocalClusterOptions& options) {
  std::unique_ptr<LocalCluster> c(new LocalCluster());
  c->options_ = options;
  if (options.workers < 1) return absl::InvalidArgumentError("--workers must be >= 1");
  // Addresses and ports first: a taken port fails here, before any process
  // starts (the coordinator checks again for itself).
  FLOTILLA_ASSIGN_OR_RETURN(ListenAddress listen, ParseListenAddress(options.listen, "--listen"));
  FLOTILLA_RETURN_IF_ERROR(CheckPortFree(listen, "--listen"));
  if (!options.http_listen.empty()) {
    FLOTILLA_ASSIGN_OR_RETURN(ListenAddress http,
                              ParseListenAddress(options.http_listen, "--http-listen"));
    FLOTILLA_RETURN_IF_ERROR(CheckPortFree(http, "--http-listen"));
  }
  FLOTILLA_RETURN_IF_ERROR(CheckServerFiles(options.tls));
  FLOTILLA_RETURN_IF_ERROR(CheckClientFiles(options.client_tls));
  if (options.tls.enabled() && !options.client_tls.enabled()) {
    return absl::InvalidArgumentError(
        "--tls-cert needs --tls-ca: the CA the workers verify the coordinator's certificate with");
  }
  if (options.device == "cuda") {
    // No GPU: say so now, not after a wait for workers that cannot start.
    FLOTILLA_ASSIGN_OR_RETURN(const int visible, VisibleGpus());
    FLOTILLA_ASSIGN_OR_RETURN(c->worker_gpus_,
                              AssignWorkerGpus(options.workers, options.gpus, visible));
  } else if (!options.gpus.empty()) {
    return absl::InvalidArgumentError("--gpus needs --device cuda");
  }
  c->coordinator_bin_ = FindBinary("flotilla-coordinator", options.bin_dir);
  c->worker_bin_ = FindBinary("flotilla-worker", options.bin_dir);
  if (c->coordinator_bin_.empty() || c->worker_bin_.empty()) {
    return absl::NotFoundError(
        "cannot find flotilla-coordinator and flotilla-worker next to flotilla "
        "(build them, or set FLOTILLA_BIN_DIR)");
  }
  if (options.model.empty()) {
    FLOTILLA_ASSIGN_OR_RETURN(c->model_, EnsureDefaultModel());
  } else {
    c->model_ = options.model;
    FLOTILLA_RETURN_IF_ERROR(LoadModelConfig(options.model).status());
  }
  for (const std::string* file : {&options.api_key_file, &options.admin_key_file}) {
    if (file->empty()) continue;
    absl::StatusOr<std::vector<std::string>> keys = ReadKeyFile(*file);
    if (!keys.ok()) return keys.status();
    if (file == &options.admin_key_file || c->key_.empty()) c->key_ = keys->front();
  }
  FLOTILLA_RETURN_IF_ERROR(c->WriteClusterToken());
  char tmpl[] = "/tmp/flotilla-up-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return absl::InternalError("mkdtemp failed");
  const std::string port_file = std::string(tmpl) + "/port";
  const std::string http_port_file = std::string(tmpl) + "/http-port";
  auto log = [&](const std::string& name) {
    return options.log_dir.empty() ? std::string() : options.log_dir + "/" + name + ".log";
  };
  if (!options.log_dir.empty()) fs::create_directories(options.log_dir);

  std::vector<std::string> coordinator_argv = {
      c->coordinator_bin_, "--model", c->model_, "--workers", std::to_string(options.workers),
      "--instances", std::to_string(options.instances),
      "--tp", std::to_string(options.tp), "--device-transport", options.device_transport,
      "--listen", options.listen, "--port-file", port_file,
      "--heartbeat-timeout-ms", std::to_string(options.heartbeat_timeout_ms),
      "--http-listen", options.http_listen, "--cluster-token-file", c->cluster_token_file_};
  coordinator_argv.insert(coordinator_argv.end(), options.coordinator_args.begin(),
                          options.coordinator_args.end());
  for (const auto& [flag, value] : {std::pair<const char*, std::string>{"--router", options.router},
                                    {"--migrate-requests", options.migrate_requests},
                                    {"--moe-parallel", options.moe_parallel}}) {
    if (!value.empty()) coordinator_argv.insert(coordinator_argv.end(), {flag, value});
  }
  for (const std::string& arg : LogArgs(options, "coordinator")) coordinator_argv.push_back(arg);
  for (const auto& [flag, value] :
       {std::pair<const char*, std::string>{"--tls-cert", options.tls.cert},
        {"--tls-key", options.tls.key},
        {"--tls-client-ca", options.tls.client_ca}}) {
    if (!value.empty()) coordinator_argv.insert(coordinator_argv.end(), {flag, value});
  }
  if (!options.http_listen.empty()) {
    coordinator_argv.push_back("--http-port-file");
    coordinator_argv.push_back(http_port_file);
  }
  if (!options.api_key_file.empty()) {
    coordinator_argv.insert(coordinator_argv.end(), {"--api-key-file", options.api_key_file});
  }
  if (!options.admin_key_file.empty()) {
    coordinator_argv.insert(coordinator_argv.end(), {"--admin-key-file", options.admin_key_file});
  }
  for (const std::string& name : options.served_model_names) {
    coordinator_argv.insert(coordinator_argv.end(), {"--served-model-name", name});
  }
  FLOTILLA_ASSIGN_OR_RETURN(c->coordinator_, c->Spawn(coordinator_argv, log("coordinator")));
  std::string port, http_port;
  absl::Status listening = c->WaitListening(port_file, http_port_file, &port, &http_port);
  fs::remove_all(tmpl);
  FLOTILLA_RETURN_IF_ERROR(listening);
  const std::string host = options.listen.substr(0, options.listen.rfind(':'));
  c->address_ = host + ":" + port;
  if (!options.http_listen.empty()) {
    c->http_address_ = options.http_listen.substr(0, options.http_listen.rfind(':')) + ":" + http_port;
  }
  // A restarted coordinator comes back on the same ports, where the workers look.
  c->coordinator_argv_ = {coordinator_argv[0]};
  for (size_t i = 1; i + 1 < coordinator_argv.size(); i += 2) {
    const std::string& flag = coordinator_argv[i];
    if (flag == "--port-file" || flag == "--http-port-file") continue;
    const std::string& value = flag == "--listen"        ? c->address_
                               : flag == "--http-listen" ? c->http_address_
                                                         : coordinator_argv[i + 1];
    c->coordinator_argv_.insert(c->coordinator_argv_.end(), {flag, value});
  }

  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  const int threads = options.threads_per_worker > 0
                          ? options.threads_per_worker
                          : std::max(1, cores / options.workers);
  for (int i = 0; i < options.workers; ++i) {
    std::vector<std::string> argv = {c->worker_bin_,   "--coordinator", c->address_,
                                     "--worker-id",    absl::StrCat("worker-", i),
                                     "--node",         "local",
                                     "--threads",      std::to_string(threads),
                                     "--comm-timeout-ms", std::to_string(options.comm_timeout_ms),
                                     "--device",       options.device,
                                     options.prefix_cache ? "--prefix-cache" : "--no-prefix-cache",
                                     "--cluster-token-file", c->cluster_token_file_,
                                     // Every peer is on this host: listen on loopback only.
                                     "--advertise-address", "127.0.0.1"};
    std::vector<std::string> env;
    if (!c->worker_gpus_.empty()) {
      const int gpu = c->worker_gpus_[i];
      const int sharing = static_cast<int>(
          std::count(c->worker_gpus_.begin(), c->worker_gpus_.end(), gpu));
      argv.insert(argv.end(), {"--cuda-device", std::to_string(gpu), "--gpu-memory-utilization",
                               absl::StrCat(options.gpu_memory_utilization / sharing)});
      if (sharing > 1 && std::getenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE") == nullptr) {
        env.push_back(absl::StrCat("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=", 100 / sharing));
      }
    }
    argv.insert(argv.end(), options.worker_args.begin(), options.worker_args.end());
    for (const std::string& arg : LogArgs(options, absl::StrCat("worker-", i))) argv.push_back(arg);
    for (const auto& [flag, value] :
         {std::pair<const char*, std::string>{"--tls-ca", options.client_tls.ca},
          {"--tls-cert", options.client_tls.cert},
          {"--tls-key", options.client_tls.key}}) {
      if (!value.empty()) argv.insert(argv.end(), {flag, value});
    }
    c->worker_argv_.push_back(argv);
    c->worker_env_.push_back(env);
    FLOTILLA_ASSIGN_OR_RETURN(pid_t pid, c->Spawn(argv, log(absl::StrCat("worker-", i)), env));
    c->workers_.push_back(pid);
    c->lives_.push_back({absl::Now(), absl::InfiniteFuture(), RestartPolicy().first_backoff, 0});
  }
  if (absl::Status ready = c->WaitReady(options.ready_timeout); !ready.ok()) {
    // Nothing is served yet: no need to give the children long to stop.
    c->Stop(absl::Seconds(1));
    return ready;
  }
  return c;
}

std::string LocalCluster::model_id() const {
  if (!options_.served_model_names.empty()) return options_.served_model_names.front();
  return DefaultModelId(model_);
}

absl::Status LocalCluster::WaitListening(const std::string& port_file,
                                         const std::string& http_port_file, std::string* port,
                                         std::string* http_port) {
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (absl::Now() < deadline) {
    std::ifstream in(port_file);
    std::ifstream http_in(http_port_file);
    if (in >> *port && (options_.http_listen.empty() || http_in >> *http_port)) {
      return absl::OkStatus();
    }
    int status = 0;
    if (waitpid(coordinator_, &status, WNOHANG) == coordinator_) {
      coordinator_ = -1;
      return absl::InternalError(absl::StrCat("flotilla-coordinator exited at start (",
                                              DescribeExit(status), "); see its log"));
    }
    if (Interrupted()) return absl::CancelledError("interrupted while the coordinator started");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return absl::DeadlineExceededError("the coordinator did not start listening within 30 s");
}

void LocalCluster::Progress(const std::string& line) const {
  if (options_.progress) options_.progress(line);
}

bool LocalCluster::Interrupted() const { return options_.interrupted && options_.interrupted(); }

absl::Status LocalCluster::WriteClusterToken() {
  std::string dir = (fs::temp_directory_path() / "flotilla-token-XXXXXX").string();
  if (mkdtemp(dir.data()) == nullptr) {  // mode 0700
    return absl::InternalError(absl::StrCat("cannot create a private directory like ", dir));
  }
  secret_dir_ = dir;
  cluster_token_file_ = dir + "/cluster-token";
  FLOTILLA_ASSIGN_OR_RETURN(std::string token, NewClusterToken());
  return WriteClusterTokenFile(cluster_token_file_, token);
}

absl::StatusOr<pid_t> LocalCluster::Spawn(const std::vector<std::string>& argv,
                                          const std::string& log,
                                          const std::vector<std::string>& env) {
  // Everything the child needs is built before fork (no allocation after it).
  std::vector<std::string> environment;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    const std::string name = entry.substr(0, entry.find('=') + 1);
    bool overridden = false;
    for (const std::string& x : env) overridden = overridden || absl::StartsWith(x, name);
    if (!overridden) environment.push_back(entry);
  }
  environment.insert(environment.end(), env.begin(), env.end());
  std::vector<char*> envp;
  for (const std::string& e : environment) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  // Under JSON logs with no log files, the child's output comes back
  // through a pipe (child_output.h).
  int output[2] = {-1, -1};
  if (log.empty() && options_.log_format == "json" && pipe2(output, O_CLOEXEC) != 0) {
    return absl::InternalError("pipe2 failed");
  }
  const pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    for (int fd : output) {
      if (fd >= 0) close(fd);
    }
    return absl::InternalError("fork failed");
  }
  if (pid == 0) {
    // Children die with the process that started them: no orphans.
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(1);
    // Out of the terminal's process group: Ctrl-C reaches only the parent,
    // which drains the coordinator before it stops the workers.
    setpgid(0, 0);
    if (output[1] >= 0) {
      dup2(output[1], 1);
      dup2(output[1], 2);
    }
    if (!log.empty()) {
      int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (fd >= 0) {
        dup2(fd, 1);
        dup2(fd, 2);
        close(fd);
      }
    }
    execve(args[0], args.data(), envp.data());
    _exit(127);
  }
  if (output[0] >= 0) {
    close(output[1]);
    std::erase_if(outputs_, [](const std::unique_ptr<ChildOutput>& o) { return o->done(); });
    outputs_.push_back(std::make_unique<ChildOutput>(output[0], LogTagOf(argv)));
  }
  return pid;
}

absl::Status LocalCluster::WaitReady(absl::Duration timeout) {
  FLOTILLA_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ChannelCredentials> credentials,
                            MakeChannelCredentials(options_.client_tls));
  auto stub = admin::Admin::NewStub(grpc::CreateChannel(address_, credentials));
  const absl::Time start = absl::Now();
  const absl::Time deadline = start + timeout;
  std::string last;
  absl::Time said = start;
  while (absl::Now() < deadline) {
    FLOTILLA_RETURN_IF_ERROR(CheckAlive());
    if (Interrupted()) return absl::CancelledError("interrupted while the workers loaded");
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(500));
    if (!key_.empty()) ctx.AddMetadata("authorization", "Bearer " + key_);
    admin::ClusterStatus s;
    if (stub->GetStatus(&ctx, admin::GetStatusRequest(), &s).ok()) {
      if (s.state() == admin::READY) return absl::OkStatus();
      // Nothing restarts these workers: waiting on would not help.
      if (s.state() == admin::PLACEMENT_REFUSED || s.state() == admin::DEGRADED) {
        return absl::FailedPreconditionError(
            absl::StrCat("the cluster cannot start: ", s.message()));
      }
      // Say what it is doing when that changes, and every 10 s while it does not.
      if (s.message() != last || absl::Now() - said > absl::Seconds(10)) {
        Progress(absl::StrCat(s.message(), " (", absl::ToInt64Seconds(absl::Now() - start),
                              " s)"));
        said = absl::Now();
      }
      last = s.message();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return absl::DeadlineExceededError(absl::StrCat("the cluster did not become ready within ",
                                                  absl::FormatDuration(timeout),
                                                  " (--ready-timeout-s): ", last));
}

absl::Status LocalCluster::CheckAlive() {
  auto dead = [](pid_t& pid) {
    if (pid <= 0) return true;
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) {
      pid = -1;
      return true;
    }
    return false;
  };
  if (dead(coordinator_)) return absl::UnavailableError("flotilla-coordinator is not running");
  for (size_t i = 0; i < workers_.size(); ++i) {
    if (dead(workers_[i])) {
      return absl::UnavailableError(absl::StrCat("worker-", i, " is not running"));
    }
  }
  return absl::OkStatus();
}

absl::Status LocalCluster::KillWorker(int i) {
  if (i < 0 || i >= static_cast<int>(workers_.size()) || workers_[i] <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("no running worker ", i));
  }
  kill(workers_[i], SIGKILL);
  waitpid(workers_[i], nullptr, 0);
  workers_[i] = -1;
  return absl::OkStatus();
}

absl::Status LocalCluster::RestartWorker(int i) {
  if (i < 0 || i >= static_cast<int>(workers_.size())) {
    return absl::InvalidArgumentError(absl::StrCat("no worker ", i));
  }
  if (workers_[i] > 0) return absl::FailedPreconditionError("worker is still running");
  FLOTILLA_ASSIGN_OR_RETURN(
      workers_[i],
      Spawn(worker_argv_[i],
            options_.log_dir.empty() ? std::string()
                                     : absl::StrCat(options_.log_dir, "/worker-", i, ".log"),
            worker_env_[i]));
  return absl::OkStatus();
}

std::string DescribeExit(int status) {
  if (WIFSIGNALED(status)) return absl::StrCat("killed by signal ", WTERMSIG(status));
  if (WIFEXITED(status)) return absl::StrCat("exit status ", WEXITSTATUS(status));
  return "ended";
}

absl::Status LocalCluster::Supervise(const RestartPolicy& policy) {
  int status = 0;
  if (coordinator_ > 0 && waitpid(coordinator_, &status, WNOHANG) == coordinator_) {
    coordinator_ = -1;
    return absl::UnavailableError(absl::StrCat("flotilla-coordinator exited (",
                                               DescribeExit(status), ")"));
  }
  if (coordinator_ <= 0) return absl::UnavailableError("flotilla-coordinator is not running");
  const absl::Time now = absl::Now();
  for (size_t i = 0; i < workers_.size(); ++i) {
    if (workers_[i] > 0 && waitpid(workers_[i], &status, WNOHANG) == workers_[i]) {
      workers_[i] = -1;
      ScheduleRestart(i, status, policy);
      if (lives_[i].quick_exits >= policy.max_quick_exits) {
        return absl::FailedPreconditionError(absl::StrCat(
            "worker-", i, " exited ", lives_[i].quick_exits, " times in a row soon after "
            "starting (last: ", DescribeExit(status), "); see its log"));
      }
    }
    if (workers_[i] <= 0 && now >= lives_[i].restart_at) {
      lives_[i].restart_at = absl::InfiniteFuture();
      lives_[i].started = now;
      FLOTILLA_RETURN_IF_ERROR(RestartWorker(static_cast<int>(i)));
      Progress(absl::StrCat("worker-", i, " restarted (pid ", workers_[i], ")"));
    }
  }
  return absl::OkStatus();
}

void LocalCluster::ScheduleRestart(size_t i, int status, const RestartPolicy& policy) {
  WorkerLife& life = lives_[i];
  const absl::Time now = absl::Now();
  if (now - life.started >= policy.healthy_after) {
    life.backoff = policy.first_backoff;
    life.quick_exits = 0;
  }
  ++life.quick_exits;
  life.restart_at = now + life.backoff;
  Progress(absl::StrCat("worker-", i, " exited (", DescribeExit(status), "); restarting it in ",
                        absl::FormatDuration(life.backoff)));
  life.backoff = std::min(life.backoff * 2, policy.max_backoff);
}

void LocalCluster::Drain(absl::Duration timeout, const std::function<bool()>& stop_now) {
  if (coordinator_ > 0) kill(coordinator_, SIGTERM);
  const absl::Time deadline = absl::Now() + timeout;
  bool hurried = false;
  while (coordinator_ > 0 && absl::Now() < deadline) {
    int status = 0;
    if (waitpid(coordinator_, &status, WNOHANG) == coordinator_) {
      coordinator_ = -1;
      break;
    }
    if (!hurried && stop_now && stop_now()) {
      kill(coordinator_, SIGTERM);  // its second signal: stop at once
      hurried = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  Stop(hurried ? absl::Seconds(1) : absl::Seconds(5));
}

absl::Status LocalCluster::KillCoordinator() {
  if (coordinator_ <= 0) return absl::FailedPreconditionError("the coordinator is not running");
  kill(coordinator_, SIGKILL);
  waitpid(coordinator_, nullptr, 0);
  coordinator_ = -1;
  return absl::OkStatus();
}

absl::Status LocalCluster::RestartCoordinator() {
  if (coordinator_ > 0) return absl::FailedPreconditionError("the coordinator is still running");
  FLOTILLA_ASSIGN_OR_RETURN(
      coordinator_,
      Spawn(coordinator_argv_, options_.log_dir.empty()
                                   ? std::string()
                                   : absl::StrCat(options_.log_dir, "/coordinator.log")));
  return absl::OkStatus();
}

void LocalCluster::Stop(absl::Duration grace) {
  std::vector<pid_t*> all;
  for (pid_t& p : workers_) all.push_back(&p);
  all.push_back(&coordinator_);
  for (pid_t* p : all) {
    if (*p > 0) kill(*p, SIGTERM);
  }
  const absl::Time deadline = absl::Now() + grace;
  for (pid_t* p : all) {
    while (*p > 0) {
      int status = 0;
      if (waitpid(*p, &status, WNOHANG) == *p) {
        *p = -1;
        break;
      }
      if (absl::Now() > deadline) {
        kill(*p, SIGKILL);
        waitpid(*p, &status, 0);
        *p = -1;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  // Every child is gone: their output ends, and its last lines are out.
  outputs_.clear();
  if (!secret_dir_.empty()) {
    std::error_code ec;
    fs::remove_all(secret_dir_, ec);
    secret_dir_.clear();
  }
}

LocalCluster::~LocalCluster() { Stop(); }

}  // namespace flotilla::cli
