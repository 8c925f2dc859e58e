#include "worker/worker_runtime.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/build_info.h"
#include "common/comm_names.h"
#include "common/expert_map_proto.h"
#include "common/status.h"
#include "spdlog/spdlog.h"
#include "worker/advertise_address.h"
#include "worker/control_session.h"
#include "worker/device_report.h"
#include "worker/draft_head.h"
#include "worker/kv_events_report.h"

namespace flotilla::worker {
namespace {

uint64_t NowUnixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string HostName() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "localhost";
  return buf;
}

cluster::WorkerMessage ErrorMessage(std::string message, bool fatal = false) {
  cluster::WorkerMessage err;
  err.mutable_error()->set_message(std::move(message));
  if (fatal) err.mutable_error()->set_fatal(true);
  return err;
}

// Session errors that another attempt cannot mend: the worker gives up.
bool Permanent(const absl::Status& ended) {
  switch (ended.code()) {
    case absl::StatusCode::kUnauthenticated:
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kUnimplemented:
      return true;
    default:
      return false;
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<WorkerRuntime>> WorkerRuntime::Create(WorkerOptions options) {
  ClientFactory clients = [options] { return std::make_unique<ControlSession>(options); };
  return Create(std::move(options), std::move(clients), DefaultEngineFactories());
}

absl::StatusOr<std::unique_ptr<WorkerRuntime>> WorkerRuntime::Create(
    WorkerOptions options, std::unique_ptr<CoordinatorClient> client, EngineFactories factories,
    PeerEndpointFactory peers) {
  auto once = std::make_shared<std::unique_ptr<CoordinatorClient>>(std::move(client));
  ClientFactory clients = [once] { return std::move(*once); };
  return Create(std::move(options), std::move(clients), std::move(factories), std::move(peers));
}

absl::StatusOr<std::unique_ptr<WorkerRuntime>> WorkerRuntime::Create(
    WorkerOptions options, ClientFactory clients, EngineFactories factories,
    PeerEndpointFactory peers) {
  if (!peers) return absl::InvalidArgumentError("no peer endpoint factory");
  if (options.node.empty()) options.node = HostName();
  if (options.worker_id.empty()) options.worker_id = absl::StrCat(options.node, "-", getpid());
  if (!(options.gpu_memory_utilization > 0.0 && options.gpu_memory_utilization <= 1.0)) {
    return absl::InvalidArgumentError("gpu memory utilization must be in (0, 1]");
  }
  // A worker without its GPU stops here, not after registering as a CPU.
  if (options.device == "cuda") FLOTILLA_RETURN_IF_ERROR(CheckCudaDevice(options.cuda_device));
  if (options.kv_tokens < 1 || options.kv_block_size < 1) {
    return absl::InvalidArgumentError("kv tokens and block size must be >= 1");
  }
  if (factories.count(options.device) == 0) {
    std::string known;
    for (const auto& [name, factory] : factories)
      absl::StrAppend(&known, known.empty() ? "" : ", ", name);
    return absl::InvalidArgumentError(
        absl::StrCat("--device ", options.device, ": this worker has engines for ", known));
  }
  return std::unique_ptr<WorkerRuntime>(new WorkerRuntime(
      std::move(options), std::move(clients), std::move(factories), std::move(peers)));
}

WorkerRuntime::WorkerRuntime(WorkerOptions options, ClientFactory clients,
                             EngineFactories factories, PeerEndpointFactory peers)
    : options_(std::move(options)),
      clients_(std::move(clients)),
      factories_(std::move(factories)),
      peers_(std::move(peers)) {
  factory_ = factories_.at(options_.device).get();
  pool_ = std::make_unique<kernels::cpu::ThreadPool>(options_.threads);
}

WorkerRuntime::~WorkerRuntime() { Stop(); }

void WorkerRuntime::Stop() {
  std::lock_guard<std::mutex> lock(stop_mu_);
  stop_ = true;
  if (client_) client_->Close();
  stop_cv_.notify_all();
}

void WorkerRuntime::SleepUnlessStopped(absl::Duration wait) {
  std::unique_lock<std::mutex> lock(stop_mu_);
  stop_cv_.wait_for(lock, absl::ToChronoMilliseconds(wait), [this] { return stop_.load(); });
}

cluster::WorkerMessage WorkerRuntime::MakeHello() const {
  cluster::WorkerMessage hello;
  cluster::Hello* h = hello.mutable_hello();
  h->set_worker_id(options_.worker_id);
  h->set_node(options_.node);
  // What this worker computes on: its GPU under --device cuda, else the host's cores.
  common::DeviceInfo* device = h->mutable_device();
  device->set_kind(common::DeviceInfo::CPU);
  device->set_name(absl::StrCat("cpu x", pool_->num_threads()));
  if (options_.device == "cuda") DescribeCudaDevice(options_.cuda_device, device);
  h->set_host_memory_bytes(static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGE_SIZE));
  h->mutable_build()->set_version(GetBuildInfo().version);
  h->set_host_id(HostId());
  for (cluster::DeviceTransport t : DeviceTransports(h->device())) h->add_device_transports(t);
  if (h->device().kind() == common::DeviceInfo::CUDA) {
    h->set_gpu_memory_utilization(options_.gpu_memory_utilization);
  }
  return hello;
}

void WorkerRuntime::ReportLoad(cluster::WorkerLoad* load) const {
  load->set_running_sequences(running_count_);
  load->set_queued_sequences(queued_count_);
  load->set_kv_blocks_free(kv_free_);
  load->set_kv_blocks_total(kv_total_);
  load->set_prefix_cache_queries_tokens(prefix_queries_);
  load->set_prefix_cache_hits_tokens(prefix_hits_);
  load->set_kv_host_hit_blocks(host_hits_);
  load->set_kv_host_bytes_to_host(host_to_host_);
  load->set_kv_host_bytes_to_device(host_to_device_);
  load->set_steps(steps_);
  load->set_spec_drafted_tokens(spec_drafted_);
  load->set_spec_accepted_tokens(spec_accepted_);
  load->set_spec_verify_steps(spec_verify_steps_);
}

absl::Status WorkerRuntime::Run() {
  absl::StatusOr<AdvertisedInterface> advertised =
      ResolveAdvertisedInterface(options_.advertise_address, options_.coordinator);
  if (!advertised.ok()) {
    return absl::Status(advertised.status().code(),
                        absl::StrCat("--advertise-address: ", advertised.status().message()));
  }
  peer_net_device_ = advertised->interface;
  spdlog::info("worker {} advertises {}: peer listeners bind interface {} only", options_.worker_id,
               advertised->address, advertised->interface);
  absl::Duration backoff = options_.reconnect_backoff;
  absl::Status ended;
  while (true) {
    std::unique_ptr<CoordinatorClient> client = clients_();
    if (!client) return ended;  // no more sessions (tests)
    const absl::Time started = absl::Now();
    ended = RunSession(std::move(client));
    if (stop_) return ended;
    if (Permanent(ended)) return ended;
    // A session that served a while starts the backoff over.
    if (absl::Now() - started > absl::Seconds(10)) backoff = options_.reconnect_backoff;
    spdlog::warn("worker {}: {}; trying again in {}", options_.worker_id, std::string(ended.message()),
                 absl::FormatDuration(backoff));
    SleepUnlessStopped(backoff);
    if (stop_) return absl::OkStatus();
    backoff = std::min(backoff * 2, options_.reconnect_backoff_max);
  }
}

absl::Status WorkerRuntime::RunSession(std::unique_ptr<CoordinatorClient> client) {
  {
    std::lock_guard<std::mutex> lock(stop_mu_);
    if (stop_) return absl::OkStatus();
    client_ = std::move(client);
  }
  absl::Status st = client_->Connect();
  if (st.ok()) {
    st = client_->Open(
        MakeHello(), [this](cluster::WorkerLoad* load) { ReportLoad(load); },
        [this](const cluster::CoordinatorMessage& m) { OnUrgent(m); });
  }
  if (st.ok()) {
    spdlog::info("worker {} connected to {}", options_.worker_id, options_.coordinator);
    EngineLoop();
    client_->Close();
    st = client_->Finish();
    if (st.ok() && !stop_) st = absl::UnavailableError("the coordinator ended the session");
  } else {
    client_->Close();
    (void)client_->Finish();
  }
  // Whatever this session set up belongs to a coordinator that no longer
  // knows this worker; a new session starts from nothing.
  Reset(stop_ ? "worker stopping" : "session ended");
  assignment_.reset();
  std::lock_guard<std::mutex> lock(stop_mu_);
  client_.reset();
  return st;
}

void WorkerRuntime::OnUrgent(const cluster::CoordinatorMessage& m) {
  if (!m.has_drop_generation()) return;
  std::lock_guard<std::mutex> lock(interrupt_mu_);
  const uint64_t generation = m.drop_generation().generation();
  if (interrupt_ && (generation == 0 || generation == interrupt_generation_)) {
    interrupt_->store(true);
  }
}

void WorkerRuntime::RefuseSubmit(const cluster::SubmitSequence& submit) {
  cluster::TokenBatch refused;
  cluster::SequenceUpdate* u = refused.add_updates();
  u->set_request_id(submit.request_id());
  u->set_finish_reason(common::ERROR);
  u->set_error_code(static_cast<int>(absl::StatusCode::kUnavailable));
  u->set_error(absl::StrCat("worker '", options_.worker_id,
                            "' has no engine running (it is loading or lost its peers)"));
  SendUpdates(std::move(refused));
}

void WorkerRuntime::EngineLoop() {
  while (!stop_ && !client_->Ended()) {
    const bool running = executor_ != nullptr;
    for (const auto& m :
         client_->Receive(running ? absl::ZeroDuration() : absl::Milliseconds(100))) {
      Handle(m);
    }
    PublishLoad();
    if (stop_ || client_->Ended() || !executor_) continue;
    PollExpertStore();
    absl::StatusOr<bool> worked = StepOnce();
    PublishLoad();
    MaybeSendExpertLoad(/*force=*/false);
    if (!worked.ok()) {
      spdlog::error("step failed: {}", worked.status().ToString());
      FailRequests(absl::UnavailableError(
          absl::StrCat("the worker's step failed: ", worked.status().message())));
      client_->Send(ErrorMessage(absl::StrCat("step failed: ", worked.status().message())));
      Reset(std::string(worked.status().message()));
      continue;
    }
    // Idle instance: back off (up to 5 ms, the added latency of a new request)
    // so idle workers do not keep cores busy with empty plan exchanges.
    if (*worked) {
      idle_sleep_us_ = 100;
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(idle_sleep_us_));
      idle_sleep_us_ = std::min<int64_t>(5000, idle_sleep_us_ * 2);
    }
  }
}

void WorkerRuntime::PublishLoad() {
  if (!scheduler_) return;
  running_count_ = scheduler_->running();
  queued_count_ = scheduler_->queued();
  prefix_queries_ = prefix_queries_base_ + scheduler_->prefix_queries_tokens();
  prefix_hits_ = prefix_hits_base_ + scheduler_->prefix_hits_tokens();
  if (rank_engine_.engine) {
    const KvHostTierStats host = rank_engine_.engine->KvHostStats();
    host_hits_ = host_base_.hit_blocks + host.hit_blocks;
    host_to_host_ = host_base_.bytes_to_host + host.bytes_to_host;
    host_to_device_ = host_base_.bytes_to_device + host.bytes_to_device;
  }
  const SpeculativeCounts& spec = scheduler_->speculative_counts();
  spec_drafted_ = spec_base_.drafted + spec.drafted;
  spec_accepted_ = spec_base_.accepted + spec.accepted;
  spec_verify_steps_ = spec_base_.verify_steps + spec.verify_steps;
  // The coordinator hears of work before any of its tokens, and of the end
  // of it with the counts it left, right after its last tokens: once every
  // request in flight has its answer, its view of the worker (running and
  // queued sequences, the prefix-cache counters) is not a heartbeat behind.
  const bool busy = running_count_ > 0 || queued_count_ > 0;
  if (busy != busy_) {
    busy_ = busy;
    client_->ReportLoadNow();
  }
}

void WorkerRuntime::Handle(const cluster::CoordinatorMessage& m) {
  switch (m.kind_case()) {
    case cluster::CoordinatorMessage::kAssignment: {
      // The coordinator has failed what it had sent; say so for anything left.
      FailRequests(absl::UnavailableError("the coordinator formed the instance again"));
      Reset("new assignment");
      absl::Status st = Load(m.assignment());
      if (!st.ok()) {
        spdlog::error("cannot load assignment: {}", st.ToString());
        client_->Send(ErrorMessage(absl::StrCat("loading failed: ", st.message()), /*fatal=*/true));
      }
      break;
    }
    case cluster::CoordinatorMessage::kStartComm: {
      absl::Status st = StartComm(m.start_comm());
      if (!st.ok()) {
        spdlog::error("cannot join the communicator: {}", st.ToString());
        client_->Send(
            ErrorMessage(absl::StrCat("joining the communicator failed: ", st.message())));
        Reset("communicator failed");
      }
      break;
    }
    case cluster::CoordinatorMessage::kSubmit:
      if (scheduler_) {
        cluster::TokenBatch refused;
        scheduler_->Enqueue(m.submit(), &refused);
        SendUpdates(std::move(refused));
      } else {
        RefuseSubmit(m.submit());
      }
      break;
    case cluster::CoordinatorMessage::kDropGeneration:
      if (assignment_ && m.drop_generation().generation() == assignment_->generation()) {
        spdlog::warn("coordinator dropped generation {}: {}", assignment_->generation(),
                     m.drop_generation().reason());
        FailRequests(absl::UnavailableError(m.drop_generation().reason()));
        Reset(m.drop_generation().reason());
        assignment_.reset();
      }
      break;
    case cluster::CoordinatorMessage::kCancel:
      if (scheduler_) scheduler_->Cancel(m.cancel().request_id());
      break;
    case cluster::CoordinatorMessage::kPromptLogitsCredit:
      if (scheduler_) {
        scheduler_->GrantPromptLogits(m.prompt_logits_credit().request_id(),
                                      m.prompt_logits_credit().allowed_bytes());
      }
      break;
    case cluster::CoordinatorMessage::kExpertMap:
      HandleExpertMap(m.expert_map());
      break;
    case cluster::CoordinatorMessage::kMeasureEngine:
      HandleMeasure(m.measure_engine());
      break;
    case cluster::CoordinatorMessage::kShutdown:
      spdlog::info("coordinator asked to shut down: {}", m.shutdown().reason());
      Stop();
      break;
    default:
      break;
  }
}

void WorkerRuntime::SendUpdates(cluster::TokenBatch batch) {
  if (batch.updates().empty()) return;
  cluster::WorkerMessage m;
  *m.mutable_tokens() = std::move(batch);
  client_->Send(std::move(m));
}

void WorkerRuntime::SendKvEvents() {
  for (int sent = 0; sent < kMaxKvEventMessagesPerStep; ++sent) {
    const KvEventBatch batch = rank_engine_.engine->TakeKvEvents(kMaxKvEventKeys);
    if (batch.empty()) return;
    cluster::WorkerMessage m;
    *m.mutable_kv_events() = KvEventsMessage(batch, assignment_->dp_group());
    client_->Send(std::move(m));
    if (batch.keys() < kMaxKvEventKeys) return;
  }
}

void WorkerRuntime::FailRequests(const absl::Status& why) {
  if (!scheduler_) return;
  cluster::TokenBatch failed;
  scheduler_->FailAll(why, &failed);
  SendUpdates(std::move(failed));
}

void WorkerRuntime::Reset(const std::string& why) {
  if (rank_engine_.engine || comm_) spdlog::info("dropping engine state: {}", why);
  if (scheduler_) {
    prefix_queries_base_ += scheduler_->prefix_queries_tokens();
    prefix_hits_base_ += scheduler_->prefix_hits_tokens();
    if (rank_engine_.engine) {
      const KvHostTierStats host = rank_engine_.engine->KvHostStats();
      host_base_.hit_blocks += host.hit_blocks;
      host_base_.bytes_to_host += host.bytes_to_host;
      host_base_.bytes_to_device += host.bytes_to_device;
    }
    const SpeculativeCounts& spec = scheduler_->speculative_counts();
    spec_base_.drafted += spec.drafted;
    spec_base_.accepted += spec.accepted;
    spec_base_.verify_steps += spec.verify_steps;
  }
  executor_.reset();
  expert_store_.reset();
  pending_measures_.clear();  // the coordinator fails them with the instance
  expert_load_.clear();
  scheduler_.reset();
  rank_engine_.engine.reset();  // a sharded GPU engine aborts its exchanges first
  rank_engine_.context.reset();
  comm_.reset();
  peer_endpoint_.reset();
  pending_weights_.reset();
  running_count_ = 0;
  queued_count_ = 0;
}

absl::Status WorkerRuntime::Load(const cluster::Assignment& a) {
  const absl::Time start = absl::Now();
  if (!model_ || model_->model() != a.model_path()) {
    FLOTILLA_ASSIGN_OR_RETURN(model_, ModelSource::Open(a.model_path()));
  }
  FLOTILLA_ASSIGN_OR_RETURN(ParallelConfig parallel,
                            ParallelConfig::Create(a.world_size(), a.tp_size(), model_->config(),
                                                   ToMoeLayout(a.moe_layout())));
  FLOTILLA_ASSIGN_OR_RETURN(ExpertMap map, ExpertMapFromProto(a.expert_map()));
  ShardSpec shard;
  shard.tp_rank = a.tp_rank();
  shard.tp_size = a.tp_size();
  // The tensor-parallel MoE: every expert, which the engine slices.
  if (!parallel.moe_tp()) shard.experts = map.ExpertsOnRank(0, a.rank());
  if (a.world_size() > 1 && !parallel.moe_tp()) {
    // Experts a rank holds must be the same set on every layer for now.
    for (int l = 1; l < map.num_layers(); ++l) {
      if (map.ExpertsOnRank(l, a.rank()) != shard.experts) {
        return absl::UnimplementedError("per-layer expert placement differs between layers");
      }
    }
  }
  ModelWeights weights;
  weights.config = model_->config();
  if (factory_->WantsHostWeights(*model_)) {
    FLOTILLA_ASSIGN_OR_RETURN(weights, model_->LoadShard(shard));
  }
  const uint64_t weight_bytes = ShardProjectionBytes(model_->config(), shard);
  auto interrupt = std::make_shared<std::atomic<bool>>(false);
  {
    std::lock_guard<std::mutex> lock(interrupt_mu_);
    interrupt_ = interrupt;
    interrupt_generation_ = a.generation();
  }
  pending_weights_ = std::move(weights);
  assignment_ = a;
  parallel_ = parallel;

  cluster::WorkerMessage ready;
  cluster::Ready* r = ready.mutable_ready();
  r->set_generation(a.generation());
  r->set_rank(a.rank());
  r->set_weight_bytes(weight_bytes);
  r->set_expert_slots(static_cast<uint32_t>(map.SlotsOnRank(0, a.rank())) + a.redundant_experts());
  if (a.world_size() > 1) {
    PeerOptions po;
    po.timeout = options_.comm_timeout;
    po.net_device = peer_net_device_;
    po.interrupt = interrupt;
    FLOTILLA_ASSIGN_OR_RETURN(peer_endpoint_, peers_(a.comm().backend(), po));
    r->set_comm_address(peer_endpoint_->Address());
  }
  r->set_load_ms(static_cast<uint32_t>(absl::ToInt64Milliseconds(absl::Now() - start)));
  spdlog::info("rank {} of {} (tp {} dp group {}, {} MoE) loaded {} experts/layer, {} MiB in {} ms",
               a.rank(), a.world_size(), a.tp_size(), a.dp_group(),
               MoeLayoutName(parallel.moe_layout()),
               shard.experts.empty() ? model_->config().num_local_experts
                                     : static_cast<int>(shard.experts.size()),
               weight_bytes >> 20, r->load_ms());
  client_->Send(std::move(ready));
  return absl::OkStatus();
}

absl::Status WorkerRuntime::StartComm(const cluster::StartComm& sc) {
  if (!assignment_ || sc.generation() != assignment_->generation() || !pending_weights_) {
    return absl::FailedPreconditionError("StartComm for a generation this worker did not load");
  }
  const cluster::Assignment& a = *assignment_;
  if (a.world_size() > 1) {
    if (!peer_endpoint_) return absl::FailedPreconditionError("no peer endpoint was opened");
    FLOTILLA_ASSIGN_OR_RETURN(comm_, peer_endpoint_->Join(a.rank(), sc));
    peer_endpoint_.reset();
  }
  EngineSpec spec;
  spec.assignment = &a;
  spec.start = &sc;
  spec.parallel = &*parallel_;
  spec.model = model_.get();
  ModelWeights host;  // what a draft head may embed with
  host.embed = pending_weights_->embed;
  host.keepalive = pending_weights_->keepalive;
  spec.weights = std::move(*pending_weights_);
  pending_weights_.reset();
  spec.comm = comm_.get();
  spec.pool = pool_.get();
  spec.options = &options_;
  {
    std::lock_guard<std::mutex> lock(interrupt_mu_);
    spec.interrupt = interrupt_;
  }
  FLOTILLA_ASSIGN_OR_RETURN(rank_engine_, factory_->Create(std::move(spec)));
  Engine* engine = rank_engine_.engine.get();
  FLOTILLA_RETURN_IF_ERROR(SetUpDraftHead(a, host, engine));
  kv_total_ = engine->KvTotalBlocks();
  kv_free_ = engine->KvFreeBlocks();
  SchedulerLimits limits;
  limits.max_batch_tokens = std::max<uint32_t>(1, a.max_batch_tokens());
  limits.idle_prefill_tokens = a.scheduler_policy().idle_prefill_tokens();
  limits.max_sequences = std::max<uint32_t>(1, a.max_sequences());
  limits.max_model_len = a.max_model_len();
  // The coordinator's default for requests that do not choose, over this
  // worker's flags.
  SpeculativeConfig speculative = options_.speculative;
  speculative.allow_replay =
      speculative.allow_replay || a.scheduler_policy().allow_replay_drafter();
  FLOTILLA_ASSIGN_OR_RETURN(limits.speculative,
                            SpeculativeFor(a.scheduler_policy().speculative(), speculative));
  limits.speculative_max_batch = a.scheduler_policy().speculative_max_batch() != 0
                                     ? a.scheduler_policy().speculative_max_batch()
                                     : options_.speculative_max_batch;
  limits.speculative_governor = options_.speculative_governor;
  limits.grammar_drafts = options_.grammar_drafts;
  FLOTILLA_ASSIGN_OR_RETURN(limits.prefill, PrefillPolicyFromProto(a.scheduler_policy()));
  scheduler_ = std::make_unique<Scheduler>(
      engine, limits, NowUnixMs, LazyO200kVocabulary(engine->config().vocab_size), &draft_memory_);
  executor_ = std::make_unique<StepExecutor>(engine, comm_.get(), rank_engine_.context.get(),
                                             *parallel_, a.rank(), a.expert_map().version());
  executor_->SetCommTimeout(options_.comm_timeout);
  executor_->SetGroupLogits(options_.group_logits);
  {
    FLOTILLA_ASSIGN_OR_RETURN(ExpertMap initial, ExpertMapFromProto(a.expert_map()));
    expert_store_ = std::make_unique<ExpertStore>(
        model_.get(), a.rank(), a.tp_rank(), a.tp_size(), initial,
        initial.SlotsOnRank(0, a.rank()) + static_cast<int>(a.redundant_experts()),
        [engine](const ExpertMap& current, const ExpertMap& next, const ModelWeights& experts) {
          return engine->StageExperts(current, next, experts);
        });
    expert_load_version_ = initial.version();
  }
  cluster::WorkerMessage joined;
  joined.mutable_joined()->set_generation(a.generation());
  client_->Send(std::move(joined));
  spdlog::info("rank {} joined generation {}; KV {} blocks", a.rank(), a.generation(),
               engine->KvTotalBlocks());
  return absl::OkStatus();
}

absl::Status WorkerRuntime::SetUpDraftHead(const cluster::Assignment& a, const ModelWeights& host,
                                           Engine* engine) {
  const std::string& spec = a.scheduler_policy().speculative_model().empty()
                                ? options_.speculative_model
                                : a.scheduler_policy().speculative_model();
  if (spec.empty() || !parallel_->is_leader(a.rank())) {
    draft_memory_.eagle3.reset();
    draft_head_spec_.clear();
    return absl::OkStatus();
  }
  if (draft_memory_.eagle3 == nullptr || draft_head_spec_ != spec) {
    FLOTILLA_ASSIGN_OR_RETURN(draft_memory_.eagle3, LoadDraftHead(spec, *model_, host));
    draft_head_spec_ = spec;
    spdlog::info("EAGLE3 head {} loaded: hidden {}, draft vocabulary {}, target layers {}", spec,
                 draft_memory_.eagle3->config.hidden_size,
                 draft_memory_.eagle3->config.draft_vocab_size,
                 absl::StrJoin(draft_memory_.eagle3->config.aux_layers, ","));
  }
  draft_memory_.pool = pool_.get();
  if (absl::Status st = engine->SetHiddenCapture(draft_memory_.eagle3->config.aux_layers);
      !st.ok()) {
    draft_memory_.eagle3.reset();
    draft_head_spec_.clear();
    return absl::Status(st.code(), absl::StrCat("--speculative-model ", spec, ": ", st.message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> WorkerRuntime::StepOnce() {
  step_profile_.Mark(StepProfile::kBetween);
  cluster::TokenBatch out;
  cluster::StepPlan mine;
  if (executor_->leader()) mine = scheduler_->Plan(&out);
  step_profile_.Mark(StepProfile::kPlan);
  const uint64_t measure_id =
      pending_measures_.empty() ? 0 : pending_measures_.front().measure_id();
  FLOTILLA_ASSIGN_OR_RETURN(StepExecutor::Exchanged exchanged,
                            executor_->Exchange(mine, measure_id));
  step_profile_.Mark(StepProfile::kExchange);
  SendUpdates(std::move(out));
  step_profile_.Mark(StepProfile::kSend);
  absl::StatusOr<bool> worked = exchanged.any_work ? RunStep(exchanged) : false;
  if (const std::string line = step_profile_.EndStep(worked.ok() && *worked); !line.empty()) {
    spdlog::info("{}", line);
  }
  if (worked.ok() && executor_->leader()) SendKvEvents();
  // Every rank has the measurement: all run it here, after the same step.
  if (worked.ok() && exchanged.measure_id != 0) FLOTILLA_RETURN_IF_ERROR(MeasureInLockstep());
  return worked;
}

absl::StatusOr<bool> WorkerRuntime::RunStep(const StepExecutor::Exchanged& exchanged) {
  Engine& engine = *rank_engine_.engine;
  const bool leader = executor_->leader();
  cluster::TokenBatch out;
  StepExecutor::SamplerLookup sampler_for;
  if (leader)
    sampler_for = [this](const cluster::PlanItem& item) { return scheduler_->SamplerFor(item); };
  FLOTILLA_ASSIGN_OR_RETURN(std::optional<StepOutput> result,
                            executor_->Run(exchanged.plan, sampler_for));
  step_profile_.Mark(StepProfile::kEngine);
  const Engine::StepTiming timing = engine.LastStepTiming();
  step_profile_.AddEngineTiming(timing.launch_us, timing.wait_us);
  if (!result) return true;
  steps_ = executor_->steps();
  CollectExpertCounts();
  kv_free_ = engine.KvFreeBlocks();
  if (!leader) return true;

  scheduler_->Complete(exchanged.plan, *result, &out);
  if (!out.updates().empty()) {
    cluster::WorkerMessage m;
    m.mutable_tokens()->set_step(executor_->steps());
    m.mutable_tokens()->mutable_updates()->Swap(out.mutable_updates());
    client_->Send(std::move(m));
  }
  step_profile_.Mark(StepProfile::kComplete);
  return true;
}

}  // namespace flotilla::worker
