#include "coordinator/cluster/cluster_manager.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "coordinator/cluster/migration.h"
#include "coordinator/cluster/request_check.h"
#include "spdlog/spdlog.h"

namespace flotilla::coordinator {
namespace {

// Metrics of one request as it streams, on the instance serving it.
void ObserveTokens(TrackedRequest& t, ServingMetrics& m, const cluster::SequenceUpdate& u,
                   absl::Time now) {
  const int n = u.token_ids_size() + (u.has_stop_token() ? 1 : 0);
  if (n > 0) {
    m.generation_tokens += static_cast<uint64_t>(n);
    if (!t.got_token) {
      m.ttft.Observe(absl::ToDoubleSeconds(now - t.arrival));
      for (int i = 1; i < n; ++i) m.itl.Observe(0);
    } else {
      const double gap = absl::ToDoubleSeconds(now - t.last_token) / n;
      for (int i = 0; i < n; ++i) m.itl.Observe(gap);
    }
    t.got_token = true;
    t.last_token = now;
  }
  if (u.finish_reason() != common::FINISH_REASON_UNSPECIFIED) {
    t.finish = u;
    t.finish->clear_token_ids();
    t.finish->clear_logprobs();
    t.finish->clear_prompt_logits();
  }
}

// The cluster's state from its instances': serving while any serves.
admin::InstanceState MergedState(const std::vector<admin::InstanceStatus>& instances) {
  admin::InstanceState best = admin::INSTANCE_STATE_UNSPECIFIED;
  auto rank = [](admin::InstanceState s) {
    switch (s) {
      case admin::READY:
        return 5;
      case admin::LOADING:
        return 4;
      case admin::DEGRADED:
        return 3;
      case admin::WAITING_FOR_WORKERS:
        return 2;
      case admin::PLACEMENT_REFUSED:
        return 1;
      default:
        return 0;
    }
  };
  for (const admin::InstanceStatus& i : instances) {
    if (rank(i.state()) > rank(best)) best = i.state();
  }
  return best;
}

// Without a conversation key, a prompt's opening stands for one: requests
// that open alike (a tenant's system prompt) stay on one instance until the
// workers' KV reports say where it is cached, instead of each computing it on
// another instance while the first is still in flight. Prompts shorter than
// the opening share nothing worth keeping together. The opening is longer
// than what every request of a chat template shares: a Harmony chat request
// starts with the same system message (64 tokens before a plain user turn),
// and one key for all of them would keep every user on one instance.
constexpr int kPrefixRouteTokens = 256;

std::string PrefixRouteKey(const cluster::SubmitSequence& r) {
  if (r.prompt_ids_size() < kPrefixRouteTokens) return "";
  const std::string_view opening(reinterpret_cast<const char*>(r.prompt_ids().data()),
                                 kPrefixRouteTokens * sizeof(int32_t));
  return absl::StrCat("prefix:", r.cache_domain(), ":", std::hash<std::string_view>()(opening));
}

}  // namespace

absl::StatusOr<std::unique_ptr<ClusterManager>> ClusterManager::Create(ClusterOptions options) {
  if (options.instances < 1) return absl::InvalidArgumentError("instances must be >= 1");
  if (options.expected_workers < options.instances ||
      options.expected_workers % options.instances != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        options.expected_workers, " workers cannot be split evenly into ", options.instances,
        " instances; give a worker count that is a multiple of the instance count"));
  }
  auto manager = std::unique_ptr<ClusterManager>(new ClusterManager(options));
  ClusterOptions per = options;
  per.expected_workers = options.expected_workers / options.instances;
  per.instances = 1;
  for (int i = 0; i < options.instances; ++i) {
    absl::StatusOr<std::unique_ptr<Instance>> inst = Instance::Create(per, i);
    if (!inst.ok()) return inst.status();
    manager->instances_.push_back(*std::move(inst));
    manager->metrics_.push_back(std::make_unique<ServingMetrics>());
  }
  return manager;
}

ClusterManager::ClusterManager(ClusterOptions options)
    : options_(std::move(options)), router_(options_.router) {
  parked_thread_ = std::thread([this] { ParkedLoop(); });
}

ClusterManager::~ClusterManager() {
  {
    std::lock_guard<std::mutex> lock(parked_mu_);
    stop_ = true;
  }
  parked_cv_.notify_all();
  parked_thread_.join();
  // The instances stop their threads before the requests they hold go away.
  std::vector<std::unique_ptr<Instance>> instances;
  {
    std::lock_guard<std::mutex> lock(mu_);
    instances.swap(instances_);
  }
  instances.clear();
}

int ClusterManager::instance_count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(instances_.size());
}

Instance* ClusterManager::InstanceAt(int index) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (index < 0 || index >= static_cast<int>(instances_.size())) return nullptr;
  return instances_[index].get();
}

absl::StatusOr<Instance*> ClusterManager::AdminInstance(uint32_t index) const {
  Instance* inst = InstanceAt(static_cast<int>(index));
  if (inst == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("there is no instance ", index, "; this cluster has ", instance_count()));
  }
  return inst;
}

ServingMetrics& ClusterManager::MetricsOf(int instance) const {
  std::lock_guard<std::mutex> lock(mu_);
  return *metrics_[std::clamp(instance, 0, static_cast<int>(metrics_.size()) - 1)];
}

void ClusterManager::RenderServingMetrics(const std::string& labels, std::string& out) const {
  std::vector<ServingMetrics::Part> parts;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < metrics_.size(); ++i) {
      parts.emplace_back(absl::StrCat(labels, labels.empty() ? "" : ",", "instance=\"", i, "\""),
                         metrics_[i].get());
    }
  }
  ServingMetrics::RenderAll(parts, out);
}

// ---- worker sessions ----

uint64_t ClusterManager::OnSessionOpened(std::shared_ptr<WorkerSession> session) {
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t id = next_session_id_++;
  sessions_[id].session = std::move(session);
  return id;
}

int ClusterManager::InstanceForWorkerLocked(const std::string& worker_id) {
  for (const auto& inst : instances_) {
    if (inst->HasWorker(worker_id)) return inst->id();
  }
  // One instance: every worker joins it (the extra ones stand by for a rank).
  if (options_.instances == 1) return 0;
  // An instance missing a worker first (waiting to form, or a rank gone),
  // then one short of its count; in order, so workers started together
  // (consecutive devices of a node) form one instance.
  const int per = options_.expected_workers / options_.instances;
  for (const auto& inst : instances_) {
    const admin::InstanceState s = inst->InstanceStatusProto().state();
    if (s != admin::READY && s != admin::LOADING && inst->AliveWorkers() < per) return inst->id();
  }
  for (const auto& inst : instances_) {
    if (inst->AliveWorkers() < per) return inst->id();
  }
  // Every instance is whole: extra workers form another.
  ClusterOptions o = options_;
  o.expected_workers = per;
  o.instances = 1;
  const int id = static_cast<int>(instances_.size());
  absl::StatusOr<std::unique_ptr<Instance>> inst = Instance::Create(o, id);
  if (!inst.ok()) return 0;  // the layout was checked at start; not expected
  spdlog::info("worker {} is beyond the {} instances: it starts instance {}", worker_id, id, id);
  instances_.push_back(*std::move(inst));
  metrics_.push_back(std::make_unique<ServingMetrics>());
  return id;
}

void ClusterManager::OnWorkerMessage(uint64_t session_id, const cluster::WorkerMessage& message) {
  Instance* inst = nullptr;
  uint64_t inner = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = sessions_.find(session_id);
    if (it == sessions_.end()) return;
    SessionRoute& route = it->second;
    if (route.instance < 0) {
      if (message.kind_case() != cluster::WorkerMessage::kHello ||
          message.hello().worker_id().empty()) {
        // The instance refuses it with the reason (no Hello, no worker id).
        route.instance = 0;
      } else {
        route.instance = InstanceForWorkerLocked(message.hello().worker_id());
      }
      route.inner_id = instances_[route.instance]->OnSessionOpened(route.session);
      route.session.reset();
    }
    inst = instances_[route.instance].get();
    inner = route.inner_id;
  }
  if (message.kind_case() == cluster::WorkerMessage::kKvEvents) {
    // The router's view of the instance's caches; a malformed report changes nothing.
    if (absl::Status applied = prefix_index_.Apply(inst->id(), message.kv_events());
        !applied.ok()) {
      spdlog::warn("instance {}: KV events refused: {}", inst->id(), std::string(applied.message()));
    }
  }
  inst->OnWorkerMessage(inner, message);
}

void ClusterManager::OnSessionClosed(uint64_t session_id) {
  Instance* inst = nullptr;
  uint64_t inner = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = sessions_.find(session_id);
    if (it == sessions_.end()) return;
    if (it->second.instance >= 0) {
      inst = instances_[it->second.instance].get();
      inner = it->second.inner_id;
    }
    sessions_.erase(it);
  }
  if (inst != nullptr) inst->OnSessionClosed(inner);
}

// ---- requests ----

bool ClusterManager::MigrationOn() const {
  return options_.migrate_requests && !draining_ && !stop_;
}

std::string ClusterManager::NotServingReason() const {
  std::vector<std::string> why;
  std::vector<Instance*> all;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& i : instances_) all.push_back(i.get());
  }
  if (all.size() == 1) {
    const admin::InstanceStatus s = all[0]->InstanceStatusProto();
    if (s.drained()) return "the model instance is drained (flotillactl undrain --instance 0)";
    return absl::StrCat("the model instance is not ready: ", s.message());
  }
  for (Instance* i : all) {
    const admin::InstanceStatus s = i->InstanceStatusProto();
    why.push_back(absl::StrCat("instance ", s.id(), ": ",
                               s.drained() ? std::string("drained") : s.message()));
  }
  return absl::StrCat("no model instance is serving (", absl::StrJoin(why, "; "), ")");
}

absl::StatusOr<uint64_t> ClusterManager::Submit(cluster::SubmitSequence request,
                                                RequestCallbacks callbacks,
                                                const std::string& route_key) {
  // Every field is checked before availability: a malformed request is the
  // client's error even while no worker is alive.
  if (absl::Status checked = CheckSubmission(request, options_); !checked.ok()) return checked;
  if (draining_) {
    return absl::UnavailableError(
        "the server is shutting down: it finishes the requests in flight and takes no new "
        "ones; retry on another server");
  }
  auto t = std::make_shared<TrackedRequest>();
  t->request = std::move(request);
  t->client = std::move(callbacks);
  t->route_key = route_key.empty() ? PrefixRouteKey(t->request) : route_key;
  t->arrival = options_.clock->TimeNow();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (static_cast<int>(requests_.size()) >= options_.max_inflight_requests) {
      return absl::ResourceExhaustedError(absl::StrCat("server busy: ", requests_.size(),
                                                       " requests in flight; retry later"));
    }
    t->id = next_request_id_++;
    requests_[t->id] = t;
  }
  absl::Status why;
  if (!Place(t, -1, &why)) {
    std::lock_guard<std::mutex> lock(mu_);
    requests_.erase(t->id);
    return why;
  }
  return t->id;
}

bool ClusterManager::Place(const std::shared_ptr<TrackedRequest>& t, int avoid,
                           absl::Status* why) {
  std::vector<RouteCandidate> candidates;
  RouteCandidate avoided;
  bool have_avoided = false;
  {
    std::vector<Instance*> all;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const auto& i : instances_) all.push_back(i.get());
    }
    // Only the cache-aware router weighs cached prefixes.
    std::map<int, int64_t> cached;
    if (options_.router == RouterPolicy::kCacheAware) {
      cached = prefix_index_.MatchedTokensByInstance(t->request.cache_domain(),
                                                     t->request.prompt_ids());
    }
    for (Instance* i : all) {
      RouteCandidate c{i->id(), i->Load(), 0};
      if (!c.load.serving) continue;
      if (auto hit = cached.find(i->id()); hit != cached.end()) {
        c.cached_tokens = static_cast<uint64_t>(std::max<int64_t>(hit->second, 0));
      }
      if (i->id() == avoid) {
        avoided = c;
        have_avoided = true;
        continue;
      }
      candidates.push_back(c);
    }
  }
  // The instance that just failed the request only when nothing else serves.
  if (candidates.empty() && have_avoided) candidates.push_back(avoided);
  if (candidates.empty()) {
    *why = absl::UnavailableError(NotServingReason());
    return false;
  }
  const uint64_t prompt_tokens =
      static_cast<uint64_t>(t->request.prompt_ids_size()) + t->output.size();
  while (!candidates.empty()) {
    const int pick = router_.Choose(candidates, prompt_tokens, t->route_key);
    const int index = candidates[pick].instance;
    candidates.erase(candidates.begin() + pick);
    Instance* inst = InstanceAt(index);
    ServingMetrics* metrics = &MetricsOf(index);
    int attempt = 0;
    cluster::SubmitSequence submission;
    bool first = false;
    {
      std::lock_guard<std::mutex> lock(t->mu);
      if (t->finished) return true;  // cancelled meanwhile
      attempt = ++t->attempt;
      first = attempt == 1;
      t->instance = index;
      t->inner_id = 0;
      submission = t->NextSubmissionLocked();
    }
    RequestCallbacks cb = AttemptCallbacks(t, attempt);
    if (first) {
      metrics->prompt_tokens += static_cast<uint64_t>(t->request.prompt_ids_size());
      cb.on_accepted = [t](uint64_t) {
        if (t->client.on_accepted) t->client.on_accepted(t->id);
      };
    }
    absl::StatusOr<uint64_t> inner = inst->Submit(std::move(submission), std::move(cb));
    if (!inner.ok()) {
      *why = inner.status();
      continue;
    }
    router_.Remember(t->route_key, index, prompt_tokens);
    std::optional<absl::Status> cancel;
    {
      std::lock_guard<std::mutex> lock(t->mu);
      if (t->attempt == attempt) t->inner_id = *inner;
      cancel = t->cancel;
    }
    if (cancel) inst->Cancel(*inner, std::string(cancel->message()), cancel->code());
    return true;
  }
  {
    std::lock_guard<std::mutex> lock(t->mu);
    t->instance = -1;
  }
  return false;
}

RequestCallbacks ClusterManager::AttemptCallbacks(const std::shared_ptr<TrackedRequest>& t,
                                                  int attempt) {
  RequestCallbacks cb;
  cb.on_update = [this, t, attempt](const cluster::SequenceUpdate& u) {
    std::optional<cluster::SequenceUpdate> trimmed;  // without repeated prompt logits
    {
      std::lock_guard<std::mutex> lock(t->mu);
      if (t->attempt != attempt || t->finished) return;
      t->output.insert(t->output.end(), u.token_ids().begin(), u.token_ids().end());
      uint64_t logits = static_cast<uint64_t>(u.prompt_logits_size());
      if (t->prompt_logits_skip > 0 && logits > 0) {
        const uint64_t drop = std::min(t->prompt_logits_skip, logits);
        t->prompt_logits_skip -= drop;
        logits -= drop;
        trimmed = u;
        trimmed->mutable_prompt_logits()->erase(
            trimmed->mutable_prompt_logits()->begin(),
            trimmed->mutable_prompt_logits()->begin() + static_cast<int>(drop));
      }
      t->prompt_logits_sent += logits;
      ObserveTokens(*t, MetricsOf(t->instance), u, options_.clock->TimeNow());
    }
    if (t->client.on_update) t->client.on_update(trimmed ? *trimmed : u);
  };
  cb.on_done = [this, t, attempt](const absl::Status& st) { OnAttemptDone(t, attempt, st); };
  return cb;
}

void ClusterManager::OnAttemptDone(const std::shared_ptr<TrackedRequest>& t, int attempt,
                                   const absl::Status& status) {
  int failed = -1;
  size_t streamed = 0;
  std::optional<absl::Status> end;
  {
    std::lock_guard<std::mutex> lock(t->mu);
    if (t->attempt != attempt || t->finished) return;
    const bool move = status.code() == absl::StatusCode::kUnavailable && !t->cancel &&
                      t->ResumableLocked() && MigrationOn();
    if (move) {
      failed = t->instance;
      streamed = t->output.size();
      t->instance = -1;
      t->inner_id = 0;
    } else {
      // A cancel asked for while the request changed instances wins.
      end = t->cancel ? *t->cancel : status;
    }
  }
  if (end) {
    Finish(t, *end);
    return;
  }
  MetricsOf(failed).migrated++;
  spdlog::info("request {} leaves instance {} after {} tokens ({}); continuing elsewhere", t->id,
               failed, streamed, std::string(status.message()));
  absl::Status why;
  if (Place(t, failed, &why)) {
    std::lock_guard<std::mutex> lock(mu_);
    ++requests_migrated_;
    return;
  }
  // Nothing serves now: wait for an instance (this one re-formed or another).
  {
    std::lock_guard<std::mutex> lock(t->mu);
    t->parked_until = options_.clock->TimeNow() + options_.migration_wait;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    parked_.push_back(t);
  }
  parked_cv_.notify_all();
}

void ClusterManager::Finish(const std::shared_ptr<TrackedRequest>& t, const absl::Status& status) {
  std::optional<cluster::SequenceUpdate> finish;
  int instance = 0;
  {
    std::lock_guard<std::mutex> lock(t->mu);
    if (t->finished) return;
    t->finished = true;
    finish = t->finish;
    instance = std::max(t->instance, 0);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    requests_.erase(t->id);
    parked_.erase(std::remove(parked_.begin(), parked_.end(), t), parked_.end());
  }
  ServingMetrics& m = MetricsOf(instance);
  m.e2e.Observe(absl::ToDoubleSeconds(options_.clock->TimeNow() - t->arrival));
  if (status.code() == absl::StatusCode::kCancelled && status.message() == kStopStringCancel) {
    // Cancelled because the answer hit a stop string: it stopped.
    cluster::SequenceUpdate stop;
    stop.set_finish_reason(common::STOP);
    m.Finished(absl::OkStatus(), &stop);
  } else {
    m.Finished(status, finish ? &*finish : nullptr);
  }
  if (t->client.on_done) t->client.on_done(status);
}

void ClusterManager::ParkedLoop() {
  while (true) {
    {
      std::unique_lock<std::mutex> lock(parked_mu_);
      parked_cv_.wait_for(lock, std::chrono::milliseconds(50), [this] { return stop_.load(); });
      if (stop_) return;
    }
    std::vector<std::shared_ptr<TrackedRequest>> parked;
    {
      std::lock_guard<std::mutex> lock(mu_);
      parked = parked_;
    }
    const absl::Time now = options_.clock->TimeNow();
    for (const std::shared_ptr<TrackedRequest>& t : parked) {
      absl::Time until;
      {
        std::lock_guard<std::mutex> lock(t->mu);
        if (t->finished || t->instance >= 0) continue;
        until = t->parked_until;
      }
      absl::Status why;
      if (!draining_ && Place(t, -1, &why)) {
        std::lock_guard<std::mutex> lock(mu_);
        parked_.erase(std::remove(parked_.begin(), parked_.end(), t), parked_.end());
        ++requests_migrated_;
        continue;
      }
      if (draining_ || now >= until) {
        Finish(t, absl::UnavailableError(absl::StrCat(
                      "its instance failed and no instance could take it within ",
                      absl::FormatDuration(options_.migration_wait), ": ", NotServingReason())));
      }
    }
  }
}

bool ClusterManager::Cancel(uint64_t request_id, const std::string& reason,
                            absl::StatusCode code) {
  std::shared_ptr<TrackedRequest> t;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = requests_.find(request_id);
    if (it == requests_.end()) return false;
    t = it->second;
  }
  Instance* inst = nullptr;
  uint64_t inner = 0;
  {
    std::lock_guard<std::mutex> lock(t->mu);
    if (t->finished) return false;
    t->cancel = absl::Status(code, reason);
    if (t->instance >= 0 && t->inner_id != 0) {
      inst = InstanceAt(t->instance);
      inner = t->inner_id;
    } else if (t->instance >= 0) {
      return true;  // being placed: Place cancels it once the instance took it
    }
  }
  if (inst != nullptr && inst->Cancel(inner, reason, code)) return true;
  // Parked, or its instance had already let it go: end it here.
  Finish(t, absl::Status(code, reason));
  return true;
}

void ClusterManager::GrantPromptLogits(uint64_t request_id, uint64_t allowed_bytes) {
  std::shared_ptr<TrackedRequest> t;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = requests_.find(request_id);
    if (it == requests_.end()) return;
    t = it->second;
  }
  Instance* inst = nullptr;
  uint64_t inner = 0;
  {
    std::lock_guard<std::mutex> lock(t->mu);
    if (t->finished || t->instance < 0 || t->inner_id == 0) return;
    inst = InstanceAt(t->instance);
    inner = t->inner_id;
    // A moved request's attempt also sends again what the client has had.
    allowed_bytes += t->prompt_logits_repeated * sizeof(float);
  }
  inst->GrantPromptLogits(inner, allowed_bytes);
}

void ClusterManager::MeasureEngine(const cluster::MeasureEngineRequest& request,
                                   absl::Time deadline, MeasureCallback done) {
  std::vector<Instance*> all;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& i : instances_) all.push_back(i.get());
  }
  for (Instance* i : all) {
    if (i->Load().serving) return i->MeasureEngine(request, deadline, std::move(done));
  }
  all[0]->MeasureEngine(request, deadline, std::move(done));
}

bool ClusterManager::WaitReady(absl::Duration timeout) {
  const absl::Time until = absl::Now() + timeout;
  while (true) {
    std::vector<Instance*> all;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const auto& i : instances_) all.push_back(i.get());
    }
    if (all.size() == 1) return all[0]->WaitReady(timeout);
    for (Instance* i : all) {
      if (i->WaitReady(absl::ZeroDuration())) return true;
    }
    if (absl::Now() >= until) return false;
    absl::SleepFor(absl::Milliseconds(20));
  }
}

// ---- drain ----

void ClusterManager::BeginDrain() {
  if (!draining_) spdlog::info("draining: {} requests in flight, no new ones", InflightRequests());
  draining_ = true;
}

int ClusterManager::InflightRequests() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(requests_.size());
}

void ClusterManager::FailAll(const std::string& why) {
  draining_ = true;  // nothing moves any more
  std::vector<Instance*> all;
  std::vector<std::shared_ptr<TrackedRequest>> parked;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& i : instances_) all.push_back(i.get());
    parked = parked_;
  }
  for (Instance* i : all) i->FailAll(why);
  for (const auto& t : parked) Finish(t, absl::UnavailableError(why));
}

// ---- admin ----

admin::ClusterStatus ClusterManager::Status() const {
  std::vector<Instance*> all;
  uint64_t migrated = 0;
  int inflight = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& i : instances_) all.push_back(i.get());
    migrated = requests_migrated_;
    inflight = static_cast<int>(requests_.size());
  }
  // Instance 0 fills the cluster-wide fields; the others add theirs.
  admin::ClusterStatus s = all[0]->Status();
  std::vector<admin::InstanceStatus> states;
  for (Instance* i : all) states.push_back(i->InstanceStatusProto());
  for (size_t k = 1; k < all.size(); ++k) {
    const admin::ClusterStatus o = all[k]->Status();
    for (const admin::WorkerStatus& w : o.workers()) *s.add_workers() = w;
    s.set_requests_submitted(s.requests_submitted() + o.requests_submitted());
    s.set_requests_cancelled(s.requests_cancelled() + o.requests_cancelled());
  }
  s.set_expected_workers(static_cast<uint32_t>(options_.expected_workers));
  s.set_requests_in_flight(static_cast<uint32_t>(inflight));
  s.set_requests_migrated(migrated);
  for (const admin::InstanceStatus& i : states) *s.add_instances() = i;
  if (all.size() > 1) {
    s.set_state(MergedState(states));
    int serving = 0;
    std::vector<std::string> parts;
    for (const admin::InstanceStatus& i : states) {
      serving += i.state() == admin::READY ? 1 : 0;
      parts.push_back(absl::StrCat("instance ", i.id(), ": ", i.drained() ? "drained; " : "",
                                   i.message()));
    }
    s.set_message(absl::StrCat(serving, " of ", states.size(), " instances serving (",
                               absl::StrJoin(parts, "; "), ")"));
  }
  return s;
}

absl::StatusOr<admin::PlacementInfo> ClusterManager::GetPlacement(int instance) const {
  absl::StatusOr<Instance*> inst = AdminInstance(static_cast<uint32_t>(instance));
  if (!inst.ok()) return inst.status();
  return (*inst)->GetPlacement();
}

absl::StatusOr<cluster::ExpertMap> ClusterManager::GetExpertMap(int instance) const {
  absl::StatusOr<Instance*> inst = AdminInstance(static_cast<uint32_t>(instance));
  if (!inst.ok()) return inst.status();
  absl::StatusOr<cluster::ExpertMap> map = (*inst)->GetExpertMap();
  if (map.ok()) map->set_instance(static_cast<uint32_t>(instance));
  return map;
}

absl::StatusOr<cluster::ExpertMap> ClusterManager::SetExpertMap(const cluster::ExpertMap& map) {
  absl::StatusOr<Instance*> inst = AdminInstance(map.instance());
  if (!inst.ok()) return inst.status();
  cluster::ExpertMap workers_map = map;  // what the ranks get: no instance
  workers_map.clear_instance();
  absl::StatusOr<cluster::ExpertMap> applied = (*inst)->SetExpertMap(workers_map);
  if (applied.ok()) applied->set_instance(map.instance());
  return applied;
}

absl::StatusOr<admin::ExpertLoadReport> ClusterManager::ExpertLoad(
    const admin::ExpertLoadRequest& request) const {
  absl::StatusOr<Instance*> inst = AdminInstance(request.instance());
  if (!inst.ok()) return inst.status();
  return (*inst)->ExpertLoad(request);
}

absl::StatusOr<admin::RebalanceResult> ClusterManager::Rebalance(
    const admin::RebalanceRequest& request) {
  absl::StatusOr<Instance*> inst = AdminInstance(request.instance());
  if (!inst.ok()) return inst.status();
  return (*inst)->Rebalance(request);
}

absl::StatusOr<admin::DrainResult> ClusterManager::Drain(const std::string& worker_id,
                                                         bool drained) {
  std::vector<Instance*> all;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& i : instances_) all.push_back(i.get());
  }
  for (Instance* i : all) {
    if (!i->HasWorker(worker_id)) continue;
    absl::StatusOr<admin::DrainResult> r = i->Drain(worker_id, drained);
    if (r.ok()) r->set_instance(i->id());
    return r;
  }
  return all[0]->Drain(worker_id, drained);  // names the unknown worker
}

absl::StatusOr<admin::DrainResult> ClusterManager::DrainInstance(int instance, bool drained) {
  absl::StatusOr<Instance*> inst = AdminInstance(static_cast<uint32_t>(instance));
  if (!inst.ok()) return inst.status();
  (*inst)->SetDrained(drained);
  if (drained && MigrationOn()) {
    // Move what runs there to instances that serve; without one it finishes here.
    bool other = false;
    {
      std::vector<Instance*> all;
      {
        std::lock_guard<std::mutex> lock(mu_);
        for (const auto& i : instances_) all.push_back(i.get());
      }
      for (Instance* i : all) other = other || (i->id() != instance && i->Load().serving);
    }
    if (other) {
      std::vector<std::pair<uint64_t, Instance*>> moving;
      {
        std::lock_guard<std::mutex> lock(mu_);
        for (const auto& [id, t] : requests_) {
          std::lock_guard<std::mutex> l(t->mu);
          if (t->instance == instance && t->inner_id != 0 && t->ResumableLocked()) {
            moving.emplace_back(t->inner_id, *inst);
          }
        }
      }
      for (const auto& [inner, i] : moving) {
        i->Cancel(inner, absl::StrCat("instance ", instance, " is drained"),
                  absl::StatusCode::kUnavailable);
      }
    }
  }
  admin::DrainResult r;
  r.set_instance(instance);
  r.set_drained(drained);
  r.set_requests_in_flight(static_cast<uint32_t>((*inst)->InflightRequests()));
  return r;
}

}  // namespace flotilla::coordinator
