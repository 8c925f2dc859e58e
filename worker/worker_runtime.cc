#include "worker/worker_runtime.h"

#if FLOTILLA_WITH_CUDA
#include "kernels/cuda/device.h"
#include "worker/engine/cuda_engine.h"
#include "worker/parallel/device_context.h"
#endif

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/build_info.h"
#include "common/cluster_token.h"
#include "common/expert_map_proto.h"
#include "common/status.h"
#include "spdlog/spdlog.h"
#include "worker/advertise_address.h"
#include "worker/device_report.h"
#include "worker/engine_probe.h"
#include "worker/parallel/host_context.h"
#include "worker/worker_messages.h"
#if FLOTILLA_WITH_UCX
#include "comm/ucx/ucx_communicator.h"
#endif

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

constexpr uint32_t kLogitsNone = 0, kLogitsLast = 1, kLogitsAll = 2;

}  // namespace

absl::StatusOr<std::unique_ptr<WorkerRuntime>> WorkerRuntime::Create(WorkerOptions options) {
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
  return std::unique_ptr<WorkerRuntime>(new WorkerRuntime(std::move(options)));
}

WorkerRuntime::WorkerRuntime(WorkerOptions options) : options_(std::move(options)) {
  pool_ = std::make_unique<kernels::cpu::ThreadPool>(options_.threads);
}

WorkerRuntime::~WorkerRuntime() { Stop(); }

void WorkerRuntime::Stop() {
  stop_ = true;
  cv_.notify_all();
  context_.TryCancel();
}

void WorkerRuntime::Send(cluster::WorkerMessage m) {
  {
    std::lock_guard<std::mutex> lock(outbox_mu_);
    outbox_.push_back(std::move(m));
  }
  outbox_cv_.notify_one();
}

// The step loop never waits on the coordinator's stream: messages queue and
// this thread writes them in order (split when one is too large).
void WorkerRuntime::WriterLoop() {
  std::unique_lock<std::mutex> lock(outbox_mu_);
  while (true) {
    outbox_cv_.wait(lock, [this] { return writer_done_ || !outbox_.empty(); });
    if (outbox_.empty()) return;  // done and drained
    std::deque<cluster::WorkerMessage> batch;
    batch.swap(outbox_);
    lock.unlock();
    for (const cluster::WorkerMessage& m : batch) {
      if (m.ByteSizeLong() <= kMaxWorkerMessageBytes) {
        stream_->Write(m);
        continue;
      }
      for (const cluster::WorkerMessage& part : SplitWorkerMessage(m, kMaxWorkerMessageBytes)) {
        stream_->Write(part);
      }
    }
    lock.lock();
  }
}

void WorkerRuntime::DescribeDevice(common::DeviceInfo* device) const {
  device->set_kind(common::DeviceInfo::CPU);
  device->set_name(absl::StrCat("cpu x", pool_->num_threads()));
  if (options_.device == "cuda") DescribeCudaDevice(options_.cuda_device, device);
}

absl::Status WorkerRuntime::Run() {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(256 << 20);
  args.SetMaxSendMessageSize(256 << 20);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 1000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 2000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      MakeChannelCredentials(options_.tls);
  if (!credentials.ok()) return credentials.status();
  channel_ = grpc::CreateCustomChannel(options_.coordinator, *credentials, args);
  if (!channel_->WaitForConnected(std::chrono::system_clock::now() +
                                  absl::ToChronoMilliseconds(options_.connect_timeout))) {
    return absl::UnavailableError(
        absl::StrCat("cannot reach the coordinator at ", options_.coordinator));
  }
  absl::StatusOr<AdvertisedInterface> advertised =
      ResolveAdvertisedInterface(options_.advertise_address, options_.coordinator);
  if (!advertised.ok()) {
    return absl::Status(advertised.status().code(),
                        absl::StrCat("--advertise-address: ", advertised.status().message()));
  }
  ucx_net_device_ = advertised->interface;
  spdlog::info("worker {} advertises {}: peer listeners bind interface {} only", options_.worker_id,
               advertised->address, advertised->interface);
  stub_ = cluster::ClusterControl::NewStub(channel_);
  if (!options_.cluster_token.empty()) {
    context_.AddMetadata(kClusterTokenMetadataKey, options_.cluster_token);
  }
  stream_ = stub_->Session(&context_);
  std::thread writer([this] { WriterLoop(); });

  cluster::WorkerMessage hello;
  cluster::Hello* h = hello.mutable_hello();
  h->set_worker_id(options_.worker_id);
  h->set_node(options_.node);
  DescribeDevice(h->mutable_device());
  h->set_host_memory_bytes(static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGE_SIZE));
  h->mutable_build()->set_version(GetBuildInfo().version);
  h->set_comm_backend("ucx");
  h->set_host_id(HostId());
  for (const std::string& t : DeviceTransports(h->device())) h->add_device_transports(t);
  if (h->device().kind() == common::DeviceInfo::CUDA) {
    h->set_gpu_memory_utilization(options_.gpu_memory_utilization);
  }
  Send(hello);
  spdlog::info("worker {} connected to {}", options_.worker_id, options_.coordinator);

  std::thread reader([this] { ReaderLoop(); });
  std::thread heartbeat([this] { HeartbeatLoop(); });
  EngineLoop();
  Stop();
  heartbeat.join();
  {
    std::lock_guard<std::mutex> lock(outbox_mu_);
    writer_done_ = true;
  }
  outbox_cv_.notify_one();
  writer.join();
  reader.join();
  Reset("worker stopping");
  std::lock_guard<std::mutex> lock(mu_);
  return end_status_;
}

void WorkerRuntime::ReaderLoop() {
  cluster::CoordinatorMessage m;
  while (stream_->Read(&m)) {
    if (m.kind_case() == cluster::CoordinatorMessage::kWelcome) {
      heartbeat_ms_ = std::max<uint32_t>(10, m.welcome().heartbeat_interval_ms());
      continue;
    }
    std::lock_guard<std::mutex> lock(mu_);
    mailbox_.push_back(m);
    cv_.notify_all();
  }
  const bool asked_to_stop = stop_.load();
  grpc::Status st = stream_->Finish();
  if (asked_to_stop) st = grpc::Status::OK;
  {
    std::lock_guard<std::mutex> lock(mu_);
    end_status_ = st.ok() ? absl::OkStatus()
                          : absl::Status(static_cast<absl::StatusCode>(st.error_code()),
                                         absl::StrCat("coordinator ended the session: ",
                                                      st.error_message()));
  }
  stop_ = true;
  cv_.notify_all();
}

void WorkerRuntime::HeartbeatLoop() {
  while (!stop_) {
    cluster::WorkerMessage m;
    cluster::Heartbeat* hb = m.mutable_heartbeat();
    hb->set_unix_ms(NowUnixMs());
    hb->mutable_load()->set_running_sequences(running_count_);
    hb->mutable_load()->set_queued_sequences(queued_count_);
    hb->mutable_load()->set_kv_blocks_free(kv_free_);
    hb->mutable_load()->set_kv_blocks_total(kv_total_);
    hb->mutable_load()->set_prefix_cache_queries_tokens(prefix_queries_);
    hb->mutable_load()->set_prefix_cache_hits_tokens(prefix_hits_);
    Send(m);
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, std::chrono::milliseconds(heartbeat_ms_.load()), [this] { return stop_.load(); });
  }
}

void WorkerRuntime::EngineLoop() {
  while (!stop_) {
    std::deque<cluster::CoordinatorMessage> inbox;
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (!running_) {
        cv_.wait_for(lock, std::chrono::milliseconds(100),
                     [this] { return stop_.load() || !mailbox_.empty(); });
      }
      inbox.swap(mailbox_);
    }
    for (const auto& m : inbox) Handle(m);
    if (stop_ || !running_) continue;
    absl::StatusOr<bool> worked = StepOnce();
    if (!worked.ok()) {
      spdlog::error("step failed: {}", worked.status().ToString());
      FailRequests(absl::UnavailableError(
          absl::StrCat("the worker's step failed: ", worked.status().message())));
      cluster::WorkerMessage err;
      err.mutable_error()->set_message(absl::StrCat("step failed: ", worked.status().message()));
      Send(err);
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

void WorkerRuntime::Handle(const cluster::CoordinatorMessage& m) {
  switch (m.kind_case()) {
    case cluster::CoordinatorMessage::kAssignment: {
      Reset("new assignment");
      absl::Status st = Load(m.assignment());
      if (!st.ok()) {
        spdlog::error("cannot load assignment: {}", st.ToString());
        cluster::WorkerMessage err;
        err.mutable_error()->set_message(absl::StrCat("loading failed: ", st.message()));
        err.mutable_error()->set_fatal(true);
        Send(err);
      }
      break;
    }
    case cluster::CoordinatorMessage::kStartComm: {
      absl::Status st = StartComm(m.start_comm());
      if (!st.ok()) {
        spdlog::error("cannot join the communicator: {}", st.ToString());
        cluster::WorkerMessage err;
        err.mutable_error()->set_message(absl::StrCat("joining the communicator failed: ",
                                                      st.message()));
        Send(err);
        Reset("communicator failed");
      }
      break;
    }
    case cluster::CoordinatorMessage::kSubmit:
      if (running_) {
        if (pending_.size() >= 4 * std::max<uint32_t>(1, assignment_->max_sequences())) {
          cluster::WorkerMessage out;
          cluster::SequenceUpdate* u = out.mutable_tokens()->add_updates();
          u->set_request_id(m.submit().request_id());
          u->set_finish_reason(common::ERROR);
          u->set_error_code(static_cast<int>(absl::StatusCode::kResourceExhausted));
          u->set_error("worker queue full; retry later");
          Send(out);
        } else {
          pending_.push_back(m.submit());
          queued_count_ = pending_.size();
        }
      }
      break;
    case cluster::CoordinatorMessage::kCancel: {
      const uint64_t id = m.cancel().request_id();
      auto it = std::find_if(pending_.begin(), pending_.end(),
                             [&](const auto& s) { return s.request_id() == id; });
      if (it != pending_.end()) pending_.erase(it);
      auto seq = sequences_.find(id);
      if (seq != sequences_.end()) {
        kv_reserved_ -= seq->second.kv_reserved;
        to_free_.push_back(id);
        sequences_.erase(seq);
      }
      queued_count_ = pending_.size();
      break;
    }
    case cluster::CoordinatorMessage::kExpertMap:
      if (running_) {
        absl::StatusOr<ExpertMap> map = ExpertMapFromProto(m.expert_map().map());
        if (map.ok() && map->version() > map_version_) {
          pending_maps_.emplace(map->version(), std::move(*map));
        }
      }
      break;
    case cluster::CoordinatorMessage::kMeasureEngine:
      Send(AnswerMeasurement(m.measure_engine()));
      break;
    case cluster::CoordinatorMessage::kShutdown:
      spdlog::info("coordinator asked to shut down: {}", m.shutdown().reason());
      stop_ = true;
      break;
    default:
      break;
  }
}

cluster::WorkerMessage WorkerRuntime::AnswerMeasurement(const cluster::MeasureEngine& m) {
  auto got = [&]() -> absl::StatusOr<cluster::EngineMeasurement> {
    if (!running_ || !engine_) return absl::FailedPreconditionError("the worker is not serving");
    if (assignment_->world_size() > 1) {
      return absl::UnimplementedError(
          "engine measurement runs on instances of one worker; the ranks of this one step in "
          "lockstep and would all have to take part");
    }
    ProbeLimits limits;
    limits.kv_blocks_available =
        std::min(engine_->KvFreeBlocks(), engine_->KvTotalBlocks() - kv_reserved_);
    limits.max_batch_tokens = std::max<uint32_t>(1, assignment_->max_batch_tokens());
    limits.max_sequences = std::max<uint32_t>(1, assignment_->max_sequences());
    return MeasureEngine(*engine_, m.request(), limits);
  }();
  cluster::WorkerMessage out;
  cluster::EngineMeasurement* r = out.mutable_measurement();
  if (got.ok()) {
    *r = *std::move(got);
  } else {
    r->set_error_code(static_cast<int>(got.status().code()));
    r->set_error(std::string(got.status().message()));
  }
  r->set_measure_id(m.measure_id());
  r->set_worker_id(options_.worker_id);
  r->set_rank(assignment_ ? assignment_->rank() : 0);
  r->set_engine(options_.device);
  r->set_running_sequences(static_cast<uint32_t>(sequences_.size()));
  if (engine_) kv_free_ = engine_->KvFreeBlocks();
  return out;
}

void WorkerRuntime::FailRequests(const absl::Status& why) {
  cluster::WorkerMessage m;
  auto fail = [&](uint64_t request_id) {
    cluster::SequenceUpdate* u = m.mutable_tokens()->add_updates();
    u->set_request_id(request_id);
    u->set_finish_reason(common::ERROR);
    u->set_error_code(static_cast<int>(why.code()));
    u->set_error(std::string(why.message()));
  };
  for (const auto& [id, seq] : sequences_) fail(id);
  for (const cluster::SubmitSequence& s : pending_) fail(s.request_id());
  if (m.tokens().updates_size() > 0) Send(m);
}

void WorkerRuntime::Reset(const std::string& why) {
  if (engine_ || comm_) spdlog::info("dropping engine state: {}", why);
  running_ = false;
  engine_.reset();
  parallel_context_.reset();
  comm_.reset();
  ucx_endpoint_.reset();
  pending_.clear();
  sequences_.clear();
  to_free_.clear();
  engine_ids_.clear();
  pending_weights_.reset();
  pending_maps_.clear();
  map_version_ = 0;
  kv_reserved_ = 0;
  running_count_ = 0;
  queued_count_ = 0;
}

absl::Status WorkerRuntime::Load(const cluster::Assignment& a) {
  const absl::Time start = absl::Now();
  if (!model_ || model_->model() != a.model_path()) {
    FLOTILLA_ASSIGN_OR_RETURN(model_, ModelSource::Open(a.model_path()));
  }
  FLOTILLA_ASSIGN_OR_RETURN(ParallelConfig parallel,
                            ParallelConfig::Create(a.world_size(), a.tp_size(), model_->config()));
  FLOTILLA_ASSIGN_OR_RETURN(ExpertMap map, ExpertMapFromProto(a.expert_map()));
  ShardSpec shard;
  shard.tp_rank = a.tp_rank();
  shard.tp_size = a.tp_size();
  shard.experts = map.ExpertsOnRank(0, a.rank());
  if (a.world_size() > 1) {
    // Experts a rank holds must be the same set on every layer for now.
    for (int l = 1; l < map.num_layers(); ++l) {
      if (map.ExpertsOnRank(l, a.rank()) != shard.experts) {
        return absl::UnimplementedError("per-layer expert placement differs between layers");
      }
    }
  }
  ModelWeights weights;
  weights.config = model_->config();
  // A synthetic model on a GPU is generated there at StartComm: no host copy.
  if (options_.device != "cuda" || model_->synthetic() == nullptr) {
    FLOTILLA_ASSIGN_OR_RETURN(weights, model_->LoadShard(shard));
  }
  const uint64_t weight_bytes = ShardProjectionBytes(model_->config(), shard);
  pending_weights_ = std::move(weights);
  assignment_ = a;
  parallel_ = parallel;

  cluster::WorkerMessage ready;
  cluster::Ready* r = ready.mutable_ready();
  r->set_generation(a.generation());
  r->set_rank(a.rank());
  r->set_weight_bytes(weight_bytes);
  if (a.world_size() > 1) {
#if FLOTILLA_WITH_UCX
    if (a.comm().backend() != "ucx") {
      return absl::InvalidArgumentError(absl::StrCat(
          "CPU workers talk over ucx, but the coordinator asked for '", a.comm().backend(), "'"));
    }
    comm::UcxOptions uo;
    uo.timeout = options_.comm_timeout;
    // Listen (TCP) only on the advertised interface; UCX_NET_DEVICES overrides.
    if (!ucx_net_device_.empty()) uo.config_defaults.push_back({"NET_DEVICES", ucx_net_device_});
    FLOTILLA_ASSIGN_OR_RETURN(ucx_endpoint_, comm::UcxWorker::Create(uo));
    r->set_comm_address(ucx_endpoint_->Address());
#else
    return absl::FailedPreconditionError("this worker was built without UCX (FLOTILLA_UCX=OFF)");
#endif
  }
  r->set_load_ms(static_cast<uint32_t>(absl::ToInt64Milliseconds(absl::Now() - start)));
  spdlog::info("rank {} of {} (tp {} dp group {}) loaded {} experts/layer, {} MiB in {} ms",
               a.rank(), a.world_size(), a.tp_size(), a.dp_group(), shard.experts.size(),
               weight_bytes >> 20, r->load_ms());
  Send(ready);
  return absl::OkStatus();
}

absl::Status WorkerRuntime::StartComm(const cluster::StartComm& sc) {
  if (!assignment_ || sc.generation() != assignment_->generation() || !pending_weights_) {
    return absl::FailedPreconditionError("StartComm for a generation this worker did not load");
  }
  const cluster::Assignment& a = *assignment_;
  if (a.world_size() > 1) {
#if FLOTILLA_WITH_UCX
    std::vector<std::string> addresses(sc.comm().peer_addresses().begin(),
                                       sc.comm().peer_addresses().end());
    comm::UcxOptions uo;
    uo.timeout = options_.comm_timeout;
    uo.peer_secret = sc.comm().peer_secret();
    FLOTILLA_ASSIGN_OR_RETURN(comm_, comm::UcxCommunicator::Create(std::move(ucx_endpoint_),
                                                                   a.rank(), addresses, uo));
    if (options_.device != "cuda") {  // GPU ranks build a device context below
      FLOTILLA_ASSIGN_OR_RETURN(ExpertMap map, ExpertMapFromProto(a.expert_map()));
      const ModelConfig& model = pending_weights_->config;
      parallel::ContextOptions po;
      po.memory = parallel::Memory::kHost;
      po.hidden = model.hidden_size;
      po.top_k = model.num_experts_per_tok;
      // The planner's budget, plus decode tokens that may overrun it.
      po.max_tokens_per_step = int64_t{std::max<uint32_t>(1, a.max_batch_tokens())} +
                               std::max<uint32_t>(1, a.max_sequences());
      FLOTILLA_ASSIGN_OR_RETURN(parallel_context_, parallel::CreateHostContext(
                                                       *parallel_, std::move(map), comm_.get(), po));
    }
#endif
  }
  const ModelConfig& c = pending_weights_->config;
  CpuEngineOptions eo;
  eo.kv_block_size = options_.kv_block_size;
  eo.prefix_cache = options_.prefix_cache;
  const int64_t kv_heads = c.num_key_value_heads / a.tp_size();
  const int64_t seqs = std::max<uint32_t>(1, a.max_sequences());
  eo.kv_num_blocks = a.kv_blocks() > 0
                         ? a.kv_blocks()
                         : CpuEngine::KvBlocksFor(c, kv_heads, eo.kv_block_size, seqs,
                                                  std::max<int64_t>(1, options_.kv_tokens / seqs),
                                                  eo.prefix_cache);
  if (options_.device == "cuda") {
#if FLOTILLA_WITH_CUDA
    CudaEngineOptions co;
    co.device = options_.cuda_device;
    co.kv_block_size = static_cast<int>(options_.kv_block_size);
    co.prefix_cache = options_.prefix_cache;
    co.max_sequences = static_cast<int>(std::max<uint32_t>(1, a.max_sequences()));
    co.max_context = a.max_model_len();
    co.gpu_memory_utilization = options_.gpu_memory_utilization;
    co.max_batch_tokens =
        static_cast<int>(std::max<uint32_t>(1, a.max_batch_tokens())) + co.max_sequences;
    if (a.world_size() > 1) {
      // A sharded GPU rank: its exchanges run on device memory (CUDA IPC on
      // one node, NCCL across nodes); the host communicator only bootstraps them.
      FLOTILLA_ASSIGN_OR_RETURN(ExpertMap map, ExpertMapFromProto(a.expert_map()));
      parallel::DeviceContextOptions dco;
      dco.device = options_.cuda_device;
      dco.hidden = c.hidden_size;
      dco.top_k = c.num_experts_per_tok;
      dco.max_tokens_per_step = co.max_batch_tokens;
      dco.timeout = options_.comm_timeout;
      const std::string& transport = sc.comm().device_transport();
      dco.transport = transport == "cuda-ipc" ? parallel::DeviceTransport::kCudaIpc
                      : transport == "nccl"   ? parallel::DeviceTransport::kNccl
                                              : parallel::DeviceTransport::kAuto;
      FLOTILLA_ASSIGN_OR_RETURN(parallel_context_, parallel::CreateDeviceContext(
                                                       *parallel_, std::move(map), a.rank(),
                                                       *comm_, dco));
      co.parallel = parallel_context_.get();
      spdlog::info("rank {} exchanges over {}", a.rank(), parallel_context_->backend());
    }
    if (const SyntheticModelSpec* synthetic = model_->synthetic()) {
      FLOTILLA_ASSIGN_OR_RETURN(engine_, CudaEngine::CreateFromSyntheticCheckpoint(
                                             synthetic->config, synthetic->seed, co));
    } else {
      FLOTILLA_ASSIGN_OR_RETURN(engine_, CudaEngine::Create(*pending_weights_, co));
    }
    eo.kv_num_blocks = engine_->KvTotalBlocks();
#else
    return absl::FailedPreconditionError("--device cuda: this worker was built without CUDA");
#endif
  } else {
    FLOTILLA_ASSIGN_OR_RETURN(engine_, CpuEngine::Create(std::move(*pending_weights_), eo,
                                                         pool_.get(), parallel_context_.get()));
  }
  pending_weights_.reset();
  kv_total_ = engine_->KvTotalBlocks();
  kv_free_ = engine_->KvFreeBlocks();
  map_version_ = a.expert_map().version();
  running_ = true;
  cluster::WorkerMessage joined;
  joined.mutable_joined()->set_generation(a.generation());
  Send(joined);
  spdlog::info("rank {} joined generation {}; KV {} blocks", a.rank(), a.generation(),
               eo.kv_num_blocks);
  return absl::OkStatus();
}

void WorkerRuntime::Admit(const cluster::SubmitSequence& s, cluster::TokenBatch* out) {
  auto reject = [&](absl::StatusCode code, const std::string& msg) {
    cluster::SequenceUpdate* u = out->add_updates();
    u->set_request_id(s.request_id());
    u->set_finish_reason(common::ERROR);
    u->set_error_code(static_cast<int>(code));
    u->set_error(msg);
  };
  const ModelConfig& c = engine_->config();
  const int64_t prompt = s.prompt_ids_size();
  const int64_t max_len = MaxSequenceLength();
  if (prompt == 0) return reject(absl::StatusCode::kInvalidArgument, "the prompt is empty");
  for (int id : s.prompt_ids()) {
    if (id < 0 || id >= c.vocab_size) {
      return reject(absl::StatusCode::kInvalidArgument,
                    absl::StrCat("prompt token id ", id, " is outside [0, ", c.vocab_size, ")"));
    }
  }
  if (prompt >= max_len) {
    return reject(absl::StatusCode::kInvalidArgument,
                  absl::StrCat("prompt of ", prompt, " tokens leaves no room in the context of ",
                               max_len, " tokens"));
  }
  const common::SamplingParams& p = s.sampling();
  SamplingParams sp;
  sp.temperature = p.has_temperature() ? p.temperature() : 1.0f;
  sp.top_p = p.has_top_p() ? p.top_p() : 1.0f;
  sp.top_k = p.top_k();
  sp.min_p = p.min_p();
  if (p.has_seed()) sp.seed = p.seed();
  sp.frequency_penalty = p.frequency_penalty();
  sp.presence_penalty = p.presence_penalty();
  sp.repetition_penalty = p.has_repetition_penalty() ? p.repetition_penalty() : 1.0f;
  sp.logit_bias.assign(p.logit_bias().begin(), p.logit_bias().end());
  sp.logprobs = p.return_logprobs() || p.logprobs() > 0;
  sp.top_logprobs = static_cast<int>(p.logprobs());
  std::vector<int> stops;
  if (!p.ignore_eos()) stops = c.eos_token_ids;
  for (int t : p.stop_token_ids()) stops.push_back(t);
  sp.stop_token_ids = stops;
  const int64_t room = max_len - prompt;
  sp.max_tokens = p.max_tokens() == 0 ? room : std::min<int64_t>(p.max_tokens(), room);
  const std::vector<int32_t> prompt_ids(s.prompt_ids().begin(), s.prompt_ids().end());
  absl::StatusOr<std::unique_ptr<Sampler>> sampler = Sampler::Create(sp, c.vocab_size, prompt_ids);
  if (!sampler.ok()) {
    return reject(sampler.status().code(), std::string(sampler.status().message()));
  }
  Sequence seq;
  seq.request_id = s.request_id();
  seq.prompt = prompt_ids;
  seq.sampler = std::move(*sampler);
  seq.max_new = sp.max_tokens;
  seq.stop_ids = stops;
  seq.want_logprobs = sp.logprobs;
  seq.return_prompt_logits = s.return_prompt_logits();
  seq.deadline_unix_ms = s.deadline_unix_ms();
  // The whole length, cached prefix included: shared blocks are counted once
  // per sequence, so the reservations still bound the blocks in use.
  seq.kv_reserved = engine_->KvBlocksForLength(prompt + seq.max_new);
  kv_reserved_ += seq.kv_reserved;
  sequences_.emplace(seq.request_id, std::move(seq));
}

cluster::StepPlan WorkerRuntime::PlanStep(cluster::TokenBatch* rejected) {
  cluster::StepPlan plan;
  for (uint64_t id : to_free_) plan.add_free(id);
  to_free_.clear();
  int64_t budget = std::max<uint32_t>(1, assignment_->max_batch_tokens());
  const uint64_t now = NowUnixMs();
  // Decode tokens first: one per running sequence past its prompt.
  for (auto& [id, seq] : sequences_) {
    if (seq.prefilled < static_cast<int64_t>(seq.prompt.size())) continue;
    cluster::PlanItem* it = plan.add_items();
    it->set_request_id(id);
    it->add_tokens(seq.generated.back());
    it->set_logits(kLogitsLast);
    --budget;
  }
  // Admit queued requests while the KV reservation and the sequence cap allow
  // (the policy when KV runs short: queue, never preempt; running sequences
  // always finish, so the queue always drains).
  const int64_t total_blocks = engine_->KvTotalBlocks();
  while (!pending_.empty() &&
         sequences_.size() < std::max<uint32_t>(1, assignment_->max_sequences())) {
    const cluster::SubmitSequence& s = pending_.front();
    if (s.deadline_unix_ms() != 0 && now > s.deadline_unix_ms()) {
      cluster::SequenceUpdate* u = rejected->add_updates();
      u->set_request_id(s.request_id());
      u->set_finish_reason(common::ERROR);
      u->set_error_code(static_cast<int>(absl::StatusCode::kDeadlineExceeded));
      u->set_error("deadline passed while queued");
      pending_.pop_front();
      continue;
    }
    const int64_t need = engine_->KvBlocksForLength(
        std::min<int64_t>(MaxSequenceLength(),
                          s.prompt_ids_size() + (s.sampling().max_tokens() == 0
                                                     ? MaxSequenceLength()
                                                     : s.sampling().max_tokens())));
    if (need > total_blocks) {
      cluster::SequenceUpdate* u = rejected->add_updates();
      u->set_request_id(s.request_id());
      u->set_finish_reason(common::ERROR);
      u->set_error_code(static_cast<int>(absl::StatusCode::kInvalidArgument));
      u->set_error(absl::StrCat("the request needs ", need, " KV blocks but a worker has ",
                                total_blocks, "; lower max_tokens or the prompt"));
      pending_.pop_front();
      continue;
    }
    if (kv_reserved_ + need > total_blocks) break;  // wait for running sequences to finish
    cluster::SubmitSequence sub = std::move(pending_.front());
    pending_.pop_front();
    Admit(sub, rejected);
  }
  queued_count_ = pending_.size();
  // Prompt chunks within the remaining token budget.
  for (auto& [id, seq] : sequences_) {
    if (budget <= 0) continue;
    const bool first = !seq.started;
    if (first) TakeCachedPrefix(seq);
    const int64_t left = static_cast<int64_t>(seq.prompt.size()) - seq.prefilled;
    if (left <= 0) continue;
    const int64_t n = std::min(left, budget);
    cluster::PlanItem* it = plan.add_items();
    it->set_request_id(id);
    it->set_first(first);
    if (first) {
      it->mutable_cached_prefix()->Add(seq.prompt.begin(), seq.prompt.begin() + seq.prefilled);
      seq.started = true;
    }
    for (int64_t j = 0; j < n; ++j) it->add_tokens(seq.prompt[seq.prefilled + j]);
    it->set_logits(seq.return_prompt_logits ? kLogitsAll
                                            : (n == left ? kLogitsLast : kLogitsNone));
    budget -= n;
  }
  running_count_ = sequences_.size();
  return plan;
}

void WorkerRuntime::TakeCachedPrefix(Sequence& seq) {
  const int64_t cached = seq.return_prompt_logits ? 0 : engine_->CachedPrefixLength(seq.prompt);
  seq.prefilled = cached;
  prefix_queries_ += seq.prompt.size();
  prefix_hits_ += cached;
}

void WorkerRuntime::FinishSequence(Sequence& seq, common::FinishReason reason,
                                   cluster::SequenceUpdate* u) {
  u->set_finish_reason(reason);
  u->set_prompt_tokens(seq.prompt.size());
  kv_reserved_ -= seq.kv_reserved;
  to_free_.push_back(seq.request_id);
}

int64_t WorkerRuntime::MaxSequenceLength() const {
  const int64_t engine = engine_->MaxSequenceLength();
  const int64_t model = assignment_->max_model_len();
  return model > 0 ? std::min(engine, model) : engine;
}

Sampler* WorkerRuntime::SamplerFor(const cluster::PlanItem& item) {
  auto it = sequences_.find(item.request_id());
  if (it == sequences_.end()) return nullptr;
  const Sequence& seq = it->second;
  // Decode tokens and the chunk that completes the prompt draw a token.
  const int64_t prompt = static_cast<int64_t>(seq.prompt.size());
  return seq.prefilled + item.tokens_size() >= prompt ? seq.sampler.get() : nullptr;
}

absl::StatusOr<bool> WorkerRuntime::StepOnce() {
  const cluster::Assignment& a = *assignment_;
  const bool leader = parallel_->is_leader(a.rank());
  cluster::TokenBatch out;
  cluster::StepPlan mine;
  if (leader) mine = PlanStep(&out);
  const std::string bytes = leader ? mine.SerializeAsString() : std::string();

  // Everyone learns every leader's plan: sizes first, then the padded plans.
  cluster::StepPlan plan;
  bool any_work = !mine.items().empty() || !mine.free().empty();
  uint64_t have_version = pending_maps_.empty() ? map_version_ : pending_maps_.rbegin()->first;
  if (a.world_size() > 1) {
    const int W = a.world_size();
    // Per rank: its plan's size, the newest expert map it has received and
    // the tokens its plan runs (the engines size their exchanges from the
    // largest).
    uint64_t plan_tokens = 0;
    for (const cluster::PlanItem& p : mine.items()) plan_tokens += p.tokens_size();
    constexpr int kHeader = 3;
    std::vector<uint64_t> header(kHeader * W), sizes(W);
    uint64_t mine_header[kHeader] = {bytes.size(), have_version, plan_tokens};
    FLOTILLA_RETURN_IF_ERROR(comm_->AllGather(mine_header, header.data(), sizeof(mine_header)));
    uint64_t max_tokens = 0;
    for (int r = 0; r < W; ++r) {
      sizes[r] = header[kHeader * r];
      have_version = std::min(have_version, header[kHeader * r + 1]);
      max_tokens = std::max(max_tokens, header[kHeader * r + 2]);
    }
    engine_->SetInstanceStepTokens(static_cast<int64_t>(max_tokens));
    uint64_t max_size = *std::max_element(sizes.begin(), sizes.end());
    any_work = max_size > 0;
    if (any_work) {
      std::string padded = bytes;
      padded.resize(max_size);
      std::string all(max_size * W, '\0');
      FLOTILLA_RETURN_IF_ERROR(comm_->AllGather(padded.data(), all.data(), max_size));
      const int lead = parallel_->leader_of_group(parallel_->dp_group_of(a.rank()));
      if (!plan.ParseFromArray(all.data() + lead * max_size, static_cast<int>(sizes[lead]))) {
        return absl::InternalError("could not parse the leader's step plan");
      }
    }
  } else {
    plan = mine;
  }
  if (!out.updates().empty()) Send([&] {
    cluster::WorkerMessage m;
    *m.mutable_tokens() = out;
    return m;
  }());
  out.Clear();
  // Switch expert maps at this boundary when every rank has the new one.
  if (have_version > map_version_ && pending_maps_.count(have_version)) {
    if (parallel_context_) parallel_context_->SetExpertMap(pending_maps_.at(have_version));
    map_version_ = have_version;
    pending_maps_.erase(pending_maps_.begin(), pending_maps_.upper_bound(have_version));
    spdlog::info("rank {} switched to expert map version {} at step {}", a.rank(), map_version_,
                 steps_);
  }
  if (!any_work) return false;

  for (uint64_t id : plan.free()) {
    auto it = engine_ids_.find(id);
    if (it == engine_ids_.end()) continue;
    FLOTILLA_RETURN_IF_ERROR(engine_->FreeSequence(it->second));
    engine_ids_.erase(it);
  }
  std::vector<StepItem> items;
  for (const cluster::PlanItem& p : plan.items()) {
    if (p.first()) {
      FLOTILLA_ASSIGN_OR_RETURN(engine_ids_[p.request_id()],
                                engine_->NewSequenceWithPrefix(
                                    {p.cached_prefix().begin(), p.cached_prefix().end()}));
    }
    StepItem it;
    it.sequence = engine_ids_.at(p.request_id());
    it.tokens.assign(p.tokens().begin(), p.tokens().end());
    // Only the leader samples (on the engine's device): the other ranks of
    // the group skip lm_head. Logit rows come back only as prompt logits.
    it.logits = leader && p.logits() == kLogitsAll ? LogitsMode::kAll : LogitsMode::kNone;
    if (leader && p.logits() != kLogitsNone) it.sampler = SamplerFor(p);
    items.push_back(std::move(it));
  }
  if (items.empty() && a.world_size() == 1) return true;
  FLOTILLA_ASSIGN_OR_RETURN(StepOutput result, engine_->Step(items));
  ++steps_;
  kv_free_ = engine_->KvFreeBlocks();
  if (!leader) return true;

  const uint64_t now = NowUnixMs();
  for (int i = 0; i < plan.items_size(); ++i) {
    const cluster::PlanItem& p = plan.items(i);
    auto sit = sequences_.find(p.request_id());
    if (sit == sequences_.end()) continue;  // cancelled during the step
    Sequence& seq = sit->second;
    const std::vector<float>& logits = result.logits[i];
    const bool prefill = seq.prefilled < static_cast<int64_t>(seq.prompt.size());
    if (prefill) {
      seq.prefilled += p.tokens_size();
      // Streamed as they come, in bounded updates (never one huge message).
      if (seq.return_prompt_logits) {
        AppendPromptLogits(seq.request_id, logits, engine_->config().vocab_size, &out);
      }
      if (seq.prefilled < static_cast<int64_t>(seq.prompt.size())) continue;
    }
    if (i >= static_cast<int>(result.sampled.size()) || result.sampled[i].token < 0) continue;
    const TokenLogprob& lp = result.sampled[i];
    const int32_t tok = lp.token;
    cluster::SequenceUpdate* u = out.add_updates();
    u->set_request_id(seq.request_id);
    const bool stop = std::find(seq.stop_ids.begin(), seq.stop_ids.end(), tok) != seq.stop_ids.end();
    if (!stop) {
      seq.generated.push_back(tok);
      u->add_token_ids(tok);
      if (seq.want_logprobs) {
        common::TokenLogprob* l = u->add_logprobs();
        l->set_token_id(lp.token);
        l->set_logprob(lp.logprob);
        for (auto& [t, v] : lp.top) {
          common::TopLogprob* top = l->add_top();
          top->set_token_id(t);
          top->set_logprob(v);
        }
      }
    }
    u->set_completion_tokens(seq.generated.size() + (stop ? 1 : 0));
    if (stop) {
      u->set_stop_token(tok);
      FinishSequence(seq, common::STOP, u);
    } else if (static_cast<int64_t>(seq.generated.size()) >= seq.max_new) {
      FinishSequence(seq, common::LENGTH, u);
    } else if (seq.deadline_unix_ms != 0 && now > seq.deadline_unix_ms) {
      u->set_finish_reason(common::ERROR);
      u->set_error_code(static_cast<int>(absl::StatusCode::kDeadlineExceeded));
      u->set_error("deadline exceeded");
      kv_reserved_ -= seq.kv_reserved;
      to_free_.push_back(seq.request_id);
    }
    if (u->finish_reason() != common::FINISH_REASON_UNSPECIFIED) sequences_.erase(sit);
  }
  running_count_ = sequences_.size();
  if (!out.updates().empty()) {
    cluster::WorkerMessage m;
    m.mutable_tokens()->set_step(steps_);
    m.mutable_tokens()->mutable_updates()->Swap(out.mutable_updates());
    Send(std::move(m));
  }
  return true;
}

}  // namespace flotilla::worker
