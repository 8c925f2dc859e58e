#include "coordinator/cluster/instance.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/cluster_token.h"
#include "common/comm_names.h"
#include "common/expert_map_proto.h"
#include "common/status.h"
#include "spdlog/spdlog.h"

namespace flotilla::coordinator {
namespace {

// A transport this build does not know is refused by name rather than
// dropped: placement would otherwise assume the worker offers both.
absl::Status CheckOfferedTransports(const cluster::Hello& hello) {
  for (int t : hello.device_transports()) {
    if (t == cluster::DEVICE_TRANSPORT_UNSPECIFIED || !cluster::DeviceTransport_IsValid(t)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Hello offers device transport ",
          DeviceTransportName(static_cast<cluster::DeviceTransport>(t)),
          ", which this coordinator does not know; accepted: cuda-ipc, nccl"));
    }
  }
  return absl::OkStatus();
}

// What placement needs from a worker's Hello.
WorkerDesc DescribeWorker(const cluster::Hello& hello) {
  const common::DeviceInfo& d = hello.device();
  WorkerDesc w;
  w.worker_id = hello.worker_id();
  w.node = hello.node();
  w.device_index = d.index();
  w.memory_bytes = d.memory_bytes();
  if (d.kind() != common::DeviceInfo::CUDA) return w;
  w.kind = DeviceKind::kCuda;
  w.host_id = hello.host_id();
  w.device_uuid = d.uuid();
  w.device_name = d.name();
  w.free_memory_bytes = d.free_memory_bytes();
  w.memory_utilization = hello.gpu_memory_utilization();
  // Values were checked in HandleHello.
  for (int t : hello.device_transports()) {
    w.device_transports.push_back(static_cast<cluster::DeviceTransport>(t));
  }
  return w;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Instance>> Instance::Create(ClusterOptions options, int id) {
  if (options.expected_workers < 1) {
    return absl::InvalidArgumentError("expected_workers must be >= 1");
  }
  if (options.heartbeat_timeout <= options.heartbeat_interval) {
    return absl::InvalidArgumentError("heartbeat timeout must exceed the heartbeat interval");
  }
  // Refuse an impossible layout before any worker shows up.
  std::vector<WorkerDesc> probe;
  for (int i = 0; i < options.expected_workers; ++i) {
    WorkerDesc w;
    w.worker_id = absl::StrCat("w", i);
    w.node = "node";
    w.device_index = i;
    probe.push_back(std::move(w));
  }
  absl::StatusOr<Placement> p = PlanPlacement(options.model, probe, options.layout);
  if (!p.ok() && p.status().code() != absl::StatusCode::kResourceExhausted) return p.status();
  return std::unique_ptr<Instance>(new Instance(std::move(options), id));
}

Instance::Instance(ClusterOptions options, int id) : options_(std::move(options)), id_(id) {
  state_message_ = absl::StrCat("waiting for ", options_.expected_workers, " workers");
  monitor_ = std::thread([this] { MonitorLoop(); });
  if (options_.rebalance_interval > absl::ZeroDuration()) {
    auto_rebalance_ = std::thread([this] { AutoRebalanceLoop(); });
  }
}

Instance::~Instance() {
  {
    std::lock_guard<std::mutex> lock(monitor_mu_);
    stop_ = true;
  }
  monitor_cv_.notify_all();
  monitor_.join();
  {
    std::lock_guard<std::mutex> lock(mu_);  // a map change waiting gives up
  }
  map_switch_cv_.notify_all();
  if (auto_rebalance_.joinable()) auto_rebalance_.join();
}

uint64_t Instance::OnSessionOpened(std::shared_ptr<WorkerSession> session) {
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t id = next_session_id_++;
  pending_sessions_[id] = std::move(session);
  return id;
}

Instance::Worker* Instance::WorkerBySessionLocked(uint64_t session_id) {
  auto it = session_to_worker_.find(session_id);
  if (it == session_to_worker_.end()) return nullptr;
  auto w = workers_.find(it->second);
  if (w == workers_.end() || w->second.session_id != session_id) return nullptr;
  return &w->second;
}

void Instance::OnWorkerMessage(uint64_t session_id, const cluster::WorkerMessage& message) {
  std::vector<Finished> done;
  std::vector<std::pair<RequestCallbacks, cluster::SequenceUpdate>> updates;
  std::vector<MeasureResult> measured;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (message.kind_case() == cluster::WorkerMessage::kHello) {
      HandleHello(session_id, message.hello(), &done);
    } else {
      Worker* w = WorkerBySessionLocked(session_id);
      if (w == nullptr) {
        auto pending = pending_sessions_.find(session_id);
        if (pending != pending_sessions_.end()) {
          pending->second->Close(
              absl::FailedPreconditionError("the first message of a session must be Hello"));
          pending_sessions_.erase(pending);
        }
        return;
      }
      w->last_heard = Now();
      switch (message.kind_case()) {
        case cluster::WorkerMessage::kHeartbeat:
          if (message.heartbeat().has_load()) w->load = message.heartbeat().load();
          if (message.heartbeat().has_expert_load() && w->rank >= 0 && state_ == admin::READY) {
            expert_window_.Add(w->rank, Now(), message.heartbeat().expert_load());
          }
          break;
        case cluster::WorkerMessage::kExpertMapPrepared:
          OnExpertMapPreparedLocked(*w, message.expert_map_prepared());
          break;
        case cluster::WorkerMessage::kReady:
          if (message.ready().generation() == generation_ && w->rank >= 0) {
            w->ready_generation = generation_;
            w->ready = message.ready();
            spdlog::info("worker {} (rank {}) ready: {} MiB of weights in {} ms", w->worker_id,
                         w->rank, message.ready().weight_bytes() >> 20, message.ready().load_ms());
            UpdateReadyLocked();
          }
          break;
        case cluster::WorkerMessage::kJoined:
          if (message.joined().generation() == generation_ && w->rank >= 0) {
            w->joined_generation = generation_;
            UpdateReadyLocked();
          }
          break;
        case cluster::WorkerMessage::kTokens:
          HandleTokens(*w, message.tokens(), &updates, &done);
          break;
        case cluster::WorkerMessage::kMeasurement:
          measured = measurements_.Answer(w->worker_id, message.measurement());
          for (MeasureResult& m : measured) {
            if (m.result.ok()) DescribeMeasuredLocked(&*m.result);
          }
          break;
        case cluster::WorkerMessage::kError:
          spdlog::warn("worker {}: {}", w->worker_id, message.error().message());
          if (message.error().fatal()) {
            MarkDeadLocked(*w, absl::StrCat("reported a fatal error: ", message.error().message()),
                           &done);
          } else if (w->rank >= 0 && state_ == admin::LOADING &&
                     w->ready_generation == generation_) {
            // The rank dropped this generation after loading it (it could
            // not join the communicator): it can never become ready, so say
            // so instead of loading forever. A worker joining or leaving
            // re-plans. Errors sent before this generation's Ready are about
            // an older one and are only logged.
            state_ = admin::DEGRADED;
            state_message_ = absl::StrCat("rank ", w->rank, " (worker '", w->worker_id,
                                          "') failed while loading: ", message.error().message());
          } else if (w->rank >= 0 && state_ == admin::READY &&
                     w->joined_generation == generation_) {
            // The rank dropped its engine after a failed step (a peer that
            // stalled past the exchange bound, a device error): its peers
            // cannot go on without it. Fail what is in flight and form the
            // instance again on the same workers.
            ReformLocked(absl::StrCat("rank ", w->rank, " (worker '", w->worker_id,
                                      "') failed a step: ", message.error().message()),
                         &done);
          }
          break;
        default:
          break;
      }
    }
  }
  for (auto& [cb, update] : updates) {
    if (cb.on_update) cb.on_update(update);
  }
  for (MeasureResult& m : measured) m.Deliver();
  Deliver(done);
}

void Instance::HandleHello(uint64_t session_id, const cluster::Hello& hello,
                                 std::vector<Finished>* done) {
  auto pending = pending_sessions_.find(session_id);
  if (pending == pending_sessions_.end()) return;  // a second Hello on a bound session
  std::shared_ptr<WorkerSession> session = pending->second;
  pending_sessions_.erase(pending);
  if (hello.worker_id().empty()) {
    session->Close(absl::InvalidArgumentError("Hello without a worker_id"));
    return;
  }
  if (absl::Status offered = CheckOfferedTransports(hello); !offered.ok()) {
    session->Close(offered);
    return;
  }
  Worker& w = workers_[hello.worker_id()];
  if (w.alive && w.session) {
    session->Close(absl::AlreadyExistsError(
        absl::StrCat("worker id '", hello.worker_id(), "' is already connected")));
    return;
  }
  const bool rejoin = !w.worker_id.empty();
  w.worker_id = hello.worker_id();
  w.session_id = session_id;
  w.session = session;
  w.hello = hello;
  w.alive = true;
  w.last_heard = Now();
  w.ready_generation = 0;
  session_to_worker_[session_id] = w.worker_id;
  const common::DeviceInfo& device = hello.device();
  spdlog::info("worker {} {} from node {} ({}{})", w.worker_id,
               rejoin ? "rejoined" : "registered", hello.node(), device.name(),
               device.kind() == common::DeviceInfo::CUDA
                   ? absl::StrCat(" ", device.uuid(), ", ", device.memory_bytes() >> 20, " MiB, ",
                                  device.free_memory_bytes() >> 20, " MiB free")
                   : "");
  cluster::CoordinatorMessage welcome;
  welcome.mutable_welcome()->set_heartbeat_interval_ms(
      static_cast<uint32_t>(absl::ToInt64Milliseconds(options_.heartbeat_interval)));
  session->Send(welcome);
  (void)done;
  MaybeAssignLocked();
}

void Instance::MaybeAssignLocked() {
  std::vector<Worker*> alive_unassigned;
  for (auto& [id, w] : workers_) {
    if (w.alive && w.rank < 0) alive_unassigned.push_back(&w);
  }
  if (!placement_) {
    int alive = 0;
    for (auto& [id, w] : workers_) alive += w.alive ? 1 : 0;
    if (alive < options_.expected_workers) {
      state_ = admin::WAITING_FOR_WORKERS;
      state_message_ = absl::StrCat("waiting for workers: ", alive, " of ",
                                    options_.expected_workers, " registered");
      return;
    }
    std::vector<WorkerDesc> desc;
    for (Worker* w : alive_unassigned) {
      if (static_cast<int>(desc.size()) == options_.expected_workers) break;
      desc.push_back(DescribeWorker(w->hello));
    }
    absl::StatusOr<Placement> p = PlanPlacement(options_.model, desc, options_.layout);
    if (!p.ok()) {
      // More waiting would not help: these workers cannot hold the layout.
      // A worker leaving or joining tries again.
      state_ = admin::PLACEMENT_REFUSED;
      state_message_ = absl::StrCat("placement failed: ", p.status().message());
      spdlog::error("{}", state_message_);
      return;
    }
    placement_ = std::move(*p);
    loaded_map_ = placement_->expert_map;
    expert_window_.Reset(placement_->parallel.world_size(), loaded_map_->num_layers(),
                         loaded_map_->num_experts());
    for (const RankPlacement& r : placement_->ranks) workers_[r.worker_id].rank = r.rank;
    group_inflight_.assign(placement_->parallel.dp_size(), 0);
  } else {
    // Nothing to do while the instance is whole and serving or loading.
    if (state_ != admin::DEGRADED) return;
    // Fill ranks whose worker is gone with newcomers; wait while any is empty.
    const std::vector<Worker*> holders = ChooseHoldersLocked(alive_unassigned);
    if (holders.empty()) return;
    for (RankPlacement& r : placement_->ranks) {
      Worker* repl = holders[r.rank];
      if (repl->worker_id == r.worker_id) continue;
      workers_[r.worker_id].rank = -1;
      repl->rank = r.rank;
      spdlog::info("worker {} takes rank {} of {}", repl->worker_id, r.rank, r.worker_id);
      r.worker_id = repl->worker_id;
      r.node = repl->hello.node();
      r.device_index = repl->hello.device().index();
    }
  }

  if (loaded_map_ && placement_->expert_map.locations() != loaded_map_->locations()) {
    // Ranks load their base experts again; replicas come back with the balancer.
    placement_->expert_map = *ExpertMap::Create(placement_->expert_map.version() + 1,
                                                loaded_map_->world_size(), loaded_map_->locations());
  }
  ++generation_;
  comm_started_ = false;
  state_ = admin::LOADING;
  state_message_ = absl::StrCat("loading shards, generation ", generation_);
  const Placement& p = *placement_;
  cluster::CommBootstrap comm;
  comm.set_backend(p.parallel.world_size() == 1 ? cluster::COMM_BACKEND_NONE
                                                 : options_.comm_backend);
  comm.set_device_transport(p.device_transport);
  cluster::ExpertMap map = ExpertMapToProto(p.expert_map);
  for (const RankPlacement& r : p.ranks) {
    Worker& w = workers_[r.worker_id];
    w.ready_generation = 0;
    w.joined_generation = 0;
    cluster::CoordinatorMessage msg;
    cluster::Assignment* a = msg.mutable_assignment();
    a->set_generation(generation_);
    a->set_model_path(options_.model_path);
    a->set_rank(r.rank);
    a->set_world_size(p.parallel.world_size());
    a->set_tp_size(p.parallel.tp_size());
    a->set_dp_group(r.dp_group);
    a->set_tp_rank(r.tp_rank);
    *a->mutable_comm() = comm;
    *a->mutable_expert_map() = map;
    a->set_max_batch_tokens(options_.max_batch_tokens);
    a->set_max_sequences(options_.max_sequences);
    *a->mutable_scheduler_policy() = options_.scheduler_policy;
    a->set_max_model_len(options_.max_model_len);
    a->set_kv_blocks(options_.kv_blocks);
    a->set_kv_cache_dtype(options_.kv_cache_dtype);
    a->set_moe_activation(options_.moe_activation);
    a->set_redundant_experts(options_.redundant_experts);
    a->set_moe_layout(ToProto(p.parallel.moe_layout()));
    w.session->Send(msg);
  }
  spdlog::info("assigned generation {}: {}{}", generation_, p.parallel.ToString(),
               p.device_transport == cluster::DEVICE_TRANSPORT_UNSPECIFIED
                   ? ""
                   : " over " + DeviceTransportName(p.device_transport));
}

std::vector<Instance::Worker*> Instance::ChooseHoldersLocked(
    const std::vector<Worker*>& candidates) {
  std::vector<Worker*> holders;
  std::vector<bool> taken(candidates.size(), false);
  for (const RankPlacement& r : placement_->ranks) {
    Worker& holder = workers_[r.worker_id];
    if (holder.alive) {
      holders.push_back(&holder);
      continue;
    }
    // GPU ranks keep their node: their TP group and transport are there.
    Worker* repl = nullptr;
    for (size_t i = 0; i < candidates.size() && repl == nullptr; ++i) {
      const WorkerDesc d = DescribeWorker(candidates[i]->hello);
      if (taken[i] || d.kind != placement_->device ||
          (d.kind == DeviceKind::kCuda && d.node != r.node)) {
        continue;
      }
      taken[i] = true;
      repl = candidates[i];
    }
    if (repl == nullptr) {
      state_message_ = absl::StrCat("instance incomplete: waiting for ", MissingWorkersLocked());
      return {};
    }
    holders.push_back(repl);
  }
  std::vector<WorkerDesc> desc;
  for (const Worker* w : holders) desc.push_back(DescribeWorker(w->hello));
  if (absl::Status fits = CheckRankHolders(options_.model, *placement_, desc); !fits.ok()) {
    state_message_ = absl::StrCat("instance incomplete: the newcomers cannot take the missing "
                                  "ranks: ", fits.message());
    return {};
  }
  return holders;
}

void Instance::UpdateReadyLocked() {
  if (!placement_ || state_ != admin::LOADING) return;
  for (const RankPlacement& r : placement_->ranks) {
    const Worker& w = workers_[r.worker_id];
    if (!w.alive || w.ready_generation != generation_) return;
  }
  if (!comm_started_) {
    // Every rank loaded its shards and has a fresh endpoint: introduce them.
    // The group's secret for this generation keys the peers' message tags:
    // without one no generation starts (workers would refuse it anyway).
    absl::StatusOr<std::string> secret = NewClusterToken();
    if (!secret.ok()) {
      state_message_ = absl::StrCat("generation ", generation_,
                                    " cannot start: drawing its peer secret failed: ",
                                    secret.status().message());
      spdlog::error("{}", state_message_);
      return;
    }
    comm_started_ = true;
    cluster::CoordinatorMessage msg;
    cluster::StartComm* sc = msg.mutable_start_comm();
    sc->set_generation(generation_);
    sc->mutable_comm()->set_backend(placement_->parallel.world_size() == 1
                                        ? cluster::COMM_BACKEND_NONE
                                        : options_.comm_backend);
    sc->mutable_comm()->set_device_transport(placement_->device_transport);
    sc->mutable_comm()->set_peer_secret(*secret);
    for (const RankPlacement& r : placement_->ranks) {
      const Worker& w = workers_[r.worker_id];
      sc->mutable_comm()->add_peer_addresses(w.ready.comm_address());
    }
    for (const RankPlacement& r : placement_->ranks) workers_[r.worker_id].session->Send(msg);
    state_message_ = absl::StrCat("joining the communicator, generation ", generation_);
  }
  for (const RankPlacement& r : placement_->ranks) {
    if (workers_[r.worker_id].joined_generation != generation_) return;
  }
  state_ = admin::READY;
  state_message_ = absl::StrCat("serving with ", placement_->parallel.ToString());
  spdlog::info("instance ready: {}", state_message_);
  ready_cv_.notify_all();
}

std::string Instance::MissingWorkersLocked() const {
  std::vector<std::string> missing;
  if (placement_) {
    for (const RankPlacement& r : placement_->ranks) {
      auto it = workers_.find(r.worker_id);
      if (it == workers_.end() || !it->second.alive) {
        missing.push_back(absl::StrCat("worker '", r.worker_id, "' (rank ", r.rank, ")"));
      }
    }
  }
  return missing.empty() ? "workers" : absl::StrJoin(missing, ", ");
}

void Instance::MarkDeadLocked(Worker& w, const std::string& why,
                                    std::vector<Finished>* done) {
  if (!w.alive) return;
  w.alive = false;
  w.died_at = Now();
  if (w.session) w.session->Close(absl::UnavailableError(why));
  session_to_worker_.erase(w.session_id);
  w.session.reset();
  w.session_id = 0;
  spdlog::warn("worker {} is gone: {}", w.worker_id, why);
  AddFailedMeasurements(
      measurements_.FailWorker(w.worker_id,
                               absl::UnavailableError(absl::StrCat(
                                   "worker '", w.worker_id, "' is gone: ", why))),
      done);
  if (w.rank < 0) {
    // Before the first placement: the remaining workers may fit, or we wait.
    if (!placement_) MaybeAssignLocked();
    return;
  }
  const std::string msg = absl::StrCat("worker '", w.worker_id, "' (rank ", w.rank, ", node ",
                                       w.hello.node(), ") is gone: ", why);
  if (state_ == admin::READY || state_ == admin::LOADING) {
    state_ = admin::DEGRADED;
  }
  state_message_ = msg;
  FailInflightLocked(msg, done);
  DropGenerationLocked(msg, &w);
  MaybeAssignLocked();
}

void Instance::ReformLocked(const std::string& why, std::vector<Finished>* done) {
  spdlog::warn("{}; forming the instance again", why);
  state_ = admin::DEGRADED;
  state_message_ = why;
  FailInflightLocked(why, done);
  AddFailedMeasurements(measurements_.FailAll(absl::UnavailableError(why)), done);
  DropGenerationLocked(why, nullptr);
  MaybeAssignLocked();
}

void Instance::DropGenerationLocked(const std::string& why, const Worker* except) {
  if (!placement_) return;
  cluster::CoordinatorMessage msg;
  msg.mutable_drop_generation()->set_generation(generation_);
  msg.mutable_drop_generation()->set_reason(why);
  for (const RankPlacement& r : placement_->ranks) {
    const Worker& w = workers_[r.worker_id];
    if (&w != except && w.alive && w.session) w.session->Send(msg);
  }
}

void Instance::ForgetDeadWorkersLocked(absl::Time now) {
  for (auto it = workers_.begin(); it != workers_.end();) {
    const Worker& w = it->second;
    if (!w.alive && w.rank < 0 && now - w.died_at > options_.forget_dead_workers_after) {
      spdlog::info("forgetting worker {}: gone for {} s", w.worker_id,
                   absl::ToInt64Seconds(now - w.died_at));
      it = workers_.erase(it);
    } else {
      ++it;
    }
  }
}

void Instance::FailInflightLocked(const std::string& why, std::vector<Finished>* done) {
  for (auto& [id, req] : requests_) {
    done->push_back(Finished{std::move(req.callbacks), absl::UnavailableError(why), std::nullopt});
  }
  requests_.clear();
  std::fill(group_inflight_.begin(), group_inflight_.end(), 0);
}

void Instance::OnSessionClosed(uint64_t session_id) {
  std::vector<Finished> done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending_sessions_.erase(session_id);
    if (Worker* w = WorkerBySessionLocked(session_id)) {
      MarkDeadLocked(*w, "its session stream closed", &done);
    }
  }
  Deliver(done);
}

void Instance::HandleTokens(
    Worker& sender, const cluster::TokenBatch& batch,
    std::vector<std::pair<RequestCallbacks, cluster::SequenceUpdate>>* updates,
    std::vector<Finished>* done) {
  std::optional<uint64_t> foreign;  // a request this worker was not sent
  for (const cluster::SequenceUpdate& u : batch.updates()) {
    auto it = requests_.find(u.request_id());
    if (it == requests_.end()) continue;  // cancelled meanwhile
    // Only the leader that was sent the SubmitSequence reports on it.
    if (!placement_ || sender.rank < 0 ||
        sender.rank != placement_->parallel.leader_of_group(it->second.dp_group)) {
      foreign = u.request_id();
      continue;
    }
    if (u.finish_reason() == common::FINISH_REASON_UNSPECIFIED) {
      updates->push_back({it->second.callbacks, u});
      continue;
    }
    absl::Status st = absl::OkStatus();
    if (u.finish_reason() == common::ERROR) {
      auto code = static_cast<absl::StatusCode>(u.error_code());
      if (code == absl::StatusCode::kOk) code = absl::StatusCode::kInternal;
      st = absl::Status(code, u.error());
    }
    if (it->second.dp_group < static_cast<int>(group_inflight_.size()) &&
        group_inflight_[it->second.dp_group] > 0) {
      --group_inflight_[it->second.dp_group];
    }
    done->push_back(Finished{std::move(it->second.callbacks), st, u});
    requests_.erase(it);
  }
  if (foreign) {
    // A protocol violation: a bug or a hostile member. Its session ends so it
    // cannot go on guessing request ids.
    spdlog::error(
        "worker {} (rank {}) sent token updates for request {}, which is not assigned "
        "to it; dropped them and ended its session",
        sender.worker_id, sender.rank, *foreign);
    MarkDeadLocked(sender,
                   absl::StrCat("protocol violation: token updates for request ", *foreign,
                                ", which was not assigned to this worker"),
                   done);
  }
}

absl::StatusOr<uint64_t> Instance::Submit(cluster::SubmitSequence request,
                                          RequestCallbacks callbacks) {
  std::lock_guard<std::mutex> lock(mu_);
  if (state_ != admin::READY) {
    return absl::UnavailableError(absl::StrCat("the model instance is not ready: ", state_message_));
  }
  if (drained_) {
    return absl::UnavailableError(
        absl::StrCat("instance ", id_, " is drained (flotillactl undrain --instance ", id_, ")"));
  }
  const int group = ChooseGroupLocked();
  if (group < 0) {
    return absl::UnavailableError("every DP group is drained (flotillactl undrain WORKER)");
  }
  const int leader = placement_->parallel.leader_of_group(group);
  Worker& w = workers_[placement_->ranks[leader].worker_id];
  const uint64_t id = next_request_id_++;
  request.set_request_id(id);
  if (callbacks.on_accepted) callbacks.on_accepted(id);
  requests_[id] = Request{id, group, std::move(callbacks)};
  ++group_inflight_[group];
  ++requests_submitted_;
  cluster::CoordinatorMessage msg;
  *msg.mutable_submit() = std::move(request);
  w.session->Send(msg);
  return id;
}

bool Instance::Cancel(uint64_t request_id, const std::string& reason,
                            absl::StatusCode code) {
  std::vector<Finished> done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = requests_.find(request_id);
    if (it == requests_.end()) return false;
    const int group = it->second.dp_group;
    if (placement_ && state_ == admin::READY) {
      Worker& w = workers_[placement_->ranks[placement_->parallel.leader_of_group(group)].worker_id];
      cluster::CoordinatorMessage msg;
      msg.mutable_cancel()->set_request_id(request_id);
      msg.mutable_cancel()->set_reason(reason);
      if (w.session) w.session->Send(msg);
    }
    if (group < static_cast<int>(group_inflight_.size()) && group_inflight_[group] > 0) {
      --group_inflight_[group];
    }
    done.push_back(Finished{std::move(it->second.callbacks), absl::Status(code, reason),
                            std::nullopt});
    requests_.erase(it);
    if (code == absl::StatusCode::kCancelled) ++requests_cancelled_;
  }
  Deliver(done);
  return true;
}

void Instance::GrantPromptLogits(uint64_t request_id, uint64_t allowed_bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = requests_.find(request_id);
  if (it == requests_.end() || !placement_ || state_ != admin::READY) return;
  const int leader = placement_->parallel.leader_of_group(it->second.dp_group);
  auto w = workers_.find(placement_->ranks[leader].worker_id);
  if (w == workers_.end() || !w->second.session) return;
  cluster::CoordinatorMessage msg;
  msg.mutable_prompt_logits_credit()->set_request_id(request_id);
  msg.mutable_prompt_logits_credit()->set_allowed_bytes(allowed_bytes);
  w->second.session->Send(msg);
}

bool Instance::WaitReady(absl::Duration timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return ready_cv_.wait_for(lock, absl::ToChronoMilliseconds(timeout),
                            [this] { return state_ == admin::READY; });
}

int Instance::InflightRequests() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(requests_.size());
}

void Instance::FailAll(const std::string& why) {
  std::vector<Finished> done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    FailInflightLocked(why, &done);
  }
  Deliver(done);
}

void Instance::SetDrained(bool drained) {
  std::lock_guard<std::mutex> lock(mu_);
  if (drained_ != drained) {
    spdlog::info("instance {} {}: {} requests in flight", id_, drained ? "drained" : "undrained",
                 requests_.size());
  }
  drained_ = drained;
}

bool Instance::drained() const {
  std::lock_guard<std::mutex> lock(mu_);
  return drained_;
}

InstanceLoad Instance::Load() const {
  std::lock_guard<std::mutex> lock(mu_);
  InstanceLoad load;
  // An instance whose DP groups are all drained still counts: its Submit
  // refuses with that reason, and the router tries the next instance.
  load.serving = state_ == admin::READY && !drained_;
  load.requests = static_cast<int>(requests_.size());
  if (placement_) {
    for (int g = 0; g < placement_->parallel.dp_size(); ++g) {
      auto w = workers_.find(placement_->ranks[placement_->parallel.leader_of_group(g)].worker_id);
      if (w == workers_.end()) continue;
      load.kv_blocks_free += w->second.load.kv_blocks_free();
      load.kv_blocks_total += w->second.load.kv_blocks_total();
      load.queued_sequences += w->second.load.queued_sequences();
    }
  }
  return load;
}

bool Instance::HasWorker(const std::string& worker_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  return workers_.count(worker_id) > 0;
}

int Instance::AliveWorkers() const {
  std::lock_guard<std::mutex> lock(mu_);
  int alive = 0;
  for (const auto& [id, w] : workers_) alive += w.alive ? 1 : 0;
  return alive;
}

void Instance::MonitorLoop() {
  const auto tick = absl::ToChronoMilliseconds(
      std::max(absl::Milliseconds(10), options_.heartbeat_interval / 2));
  while (true) {
    {
      std::unique_lock<std::mutex> lock(monitor_mu_);
      monitor_cv_.wait_for(lock, tick, [this] { return stop_.load(); });
      if (stop_) return;
    }
    std::vector<Finished> done;
    {
      std::lock_guard<std::mutex> lock(mu_);
      const absl::Time now = Now();
      AddFailedMeasurements(measurements_.Expire(now), &done);
      for (auto& [id, w] : workers_) {
        if (w.alive && now - w.last_heard > options_.heartbeat_timeout) {
          MarkDeadLocked(w,
                         absl::StrCat("no heartbeat for ",
                                      absl::ToInt64Milliseconds(now - w.last_heard), " ms"),
                         &done);
        }
      }
      ForgetDeadWorkersLocked(now);
    }
    Deliver(done);
  }
}

void Instance::AddFailedMeasurements(std::vector<MeasureResult> failed,
                                           std::vector<Finished>* done) {
  for (MeasureResult& m : failed) {
    RequestCallbacks cb;
    cb.on_done = [m](const absl::Status&) mutable { m.Deliver(); };
    done->push_back(Finished{std::move(cb), absl::OkStatus(), std::nullopt});
  }
}

void Instance::MeasureEngine(const cluster::MeasureEngineRequest& request,
                                   absl::Time deadline, MeasureCallback done) {
  absl::Status refused;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!placement_ || state_ != admin::READY) {
      refused = absl::FailedPreconditionError(
          absl::StrCat("the instance is not serving: ", state_message_));
    } else {
      // Every rank runs the probe (the ranks step in lockstep); the
      // leader of DP group 0 speaks for the instance.
      std::vector<std::string> ranks;
      for (const RankPlacement& r : placement_->ranks) ranks.push_back(r.worker_id);
      const std::string& leader =
          placement_->ranks[placement_->parallel.leader_of_group(0)].worker_id;
      cluster::CoordinatorMessage msg;
      msg.mutable_measure_engine()->set_measure_id(
          measurements_.Add(ranks, leader, deadline, std::move(done)));
      *msg.mutable_measure_engine()->mutable_request() = request;
      // READY means every rank's session is open.
      for (const std::string& id : ranks) workers_[id].session->Send(msg);
      return;
    }
  }
  done(refused);
}

void Instance::DescribeMeasuredLocked(cluster::EngineMeasurement* m) {
  if (auto w = workers_.find(m->worker_id()); w != workers_.end()) {
    *m->mutable_device() = w->second.hello.device();
  }
  if (!placement_) return;
  m->set_world_size(placement_->parallel.world_size());
  m->set_tp_size(placement_->parallel.tp_size());
  m->set_dp_groups(placement_->parallel.dp_size());
}

void Instance::Deliver(std::vector<Finished>& done) {
  for (Finished& f : done) {
    if (f.last_update && f.callbacks.on_update) f.callbacks.on_update(*f.last_update);
    if (f.callbacks.on_done) f.callbacks.on_done(f.status);
  }
}

admin::ClusterStatus Instance::Status() const {
  std::lock_guard<std::mutex> lock(mu_);
  admin::ClusterStatus s;
  s.set_state(state_);
  s.set_model(options_.model_path);
  s.set_expected_workers(options_.expected_workers);
  s.set_generation(generation_);
  s.set_message(state_message_);
  s.set_requests_in_flight(static_cast<uint32_t>(requests_.size()));
  s.set_requests_submitted(requests_submitted_);
  s.set_requests_cancelled(requests_cancelled_);
  const absl::Time now = Now();
  for (const auto& [id, w] : workers_) {
    admin::WorkerStatus* ws = s.add_workers();
    ws->set_worker_id(id);
    ws->set_node(w.hello.node());
    *ws->mutable_device() = w.hello.device();
    ws->set_rank(w.rank);
    ws->set_alive(w.alive);
    ws->set_last_heartbeat_age_ms(absl::ToInt64Milliseconds(now - w.last_heard));
    *ws->mutable_load() = w.load;
  }
  AddDrainStatusLocked(&s);
  for (admin::WorkerStatus& ws : *s.mutable_workers()) ws.set_instance(id_);
  return s;
}

admin::InstanceStatus Instance::InstanceStatusProto() const {
  const admin::ClusterStatus s = Status();
  const InstanceLoad load = Load();
  admin::InstanceStatus i;
  i.set_id(static_cast<uint32_t>(id_));
  i.set_state(s.state());
  i.set_message(s.message());
  i.set_generation(s.generation());
  i.set_expected_workers(s.expected_workers());
  i.set_requests_in_flight(s.requests_in_flight());
  i.set_drained(drained());
  *i.mutable_drained_groups() = s.drained_groups();
  i.set_expert_map_version(s.expert_map_version());
  i.set_kv_blocks_free(load.kv_blocks_free);
  i.set_kv_blocks_total(load.kv_blocks_total);
  return i;
}

absl::StatusOr<admin::PlacementInfo> Instance::GetPlacement() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!placement_) return absl::UnavailableError(absl::StrCat("no placement yet: ", state_message_));
  admin::PlacementInfo info;
  info.set_world_size(placement_->parallel.world_size());
  info.set_tp_size(placement_->parallel.tp_size());
  info.set_dp_size(placement_->parallel.dp_size());
  info.set_ep_size(placement_->parallel.ep_size());
  info.set_groups_spanning_nodes(placement_->groups_spanning_nodes);
  info.set_device_transport(placement_->device_transport);
  info.set_moe_layout(ToProto(placement_->parallel.moe_layout()));
  for (const RankPlacement& r : placement_->ranks) {
    admin::RankInfo* ri = info.add_ranks();
    ri->set_rank(r.rank);
    ri->set_worker_id(r.worker_id);
    ri->set_node(r.node);
    ri->set_dp_group(r.dp_group);
    ri->set_tp_rank(r.tp_rank);
    ri->set_weight_bytes(placement_->bytes_per_rank[r.rank]);
    ri->set_device_index(r.device_index);
    if (!placement_->device_bytes_per_rank.empty()) {
      ri->set_device_bytes(placement_->device_bytes_per_rank[r.rank]);
    }
  }
  return info;
}

absl::StatusOr<cluster::ExpertMap> Instance::GetExpertMap() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!placement_) return absl::UnavailableError(absl::StrCat("no placement yet: ", state_message_));
  return ExpertMapToProto(placement_->expert_map);
}

}  // namespace flotilla::coordinator
