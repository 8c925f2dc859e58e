// The device ParallelContext: validates calls, keeps the step's capacity and
// the pending Dispatch, and hands the kernels' launches to a transport
// (comm/exchange_transport.h: comm/cuda_ipc or comm/nccl) that reaches the
// peers.
#include "worker/parallel/device_context.h"

#include <cuda_runtime_api.h>

#include <chrono>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/cuda_ipc/cuda_ipc_transport.h"
#include "comm/exchange_transport.h"
#include "common/cuda_status.h"
#include "common/status.h"
#include "kernels/cuda/ep_exchange.h"
#include "worker/parallel/device_expert_table.h"
#include "worker/parallel/device_topology.h"
#include "worker/parallel/exchange_buffers.h"
#if FLOTILLA_WITH_NCCL
#include "comm/nccl/nccl_transport.h"
#endif

namespace flotilla::parallel {
namespace {

namespace kc = kernels::cuda;
using comm::ExchangeTransport;

// The error word the kernels leave when a wait ran past its bound.
std::string DescribeDeviceError(int32_t word) {
  const int code = word - kc::kEpErrorBase;
  const int op = code / 65536, peer = code % 65536;
  const char* what = op == kc::kEpOpDispatch  ? "dispatch"
                     : op == kc::kEpOpCombine ? "combine"
                     : op == kc::kEpOpGather  ? "combine (joining the TP shares)"
                     : op == kc::kEpOpReduce  ? "TP all-reduce"
                                              : "an unknown operation";
  return absl::StrCat("a device wait in ", what, " for rank ", peer,
                      " ran past its bound (the rank died or stalled)");
}

class DeviceContext;

class DeviceTensorParallel final : public TensorParallel {
 public:
  explicit DeviceTensorParallel(DeviceContext* context) : context_(context) {}
  int size() const override;
  int rank() const override;
  absl::Status AllReduce(float* data, int64_t count, void* stream) override;
  absl::Status AllReduceAdd(float* part, float* residual, int64_t count, void* stream) override;
  bool DeviceLines(kc::EpLaunch* launch) override;

 private:
  DeviceContext* context_;
};

class DeviceExpertParallel final : public ExpertParallel {
 public:
  explicit DeviceExpertParallel(DeviceContext* context) : context_(context) {}
  void SetStepTokens(int64_t max_tokens_any_rank) override;
  absl::StatusOr<ExpertRows> Dispatch(int layer, const void* x, const int32_t* topk_ids,
                                      const float* topk_w, int64_t tokens, void* stream) override;
  absl::Status Combine(int layer, float* y, void* stream) override;

 private:
  DeviceContext* context_;
};

class DeviceContext final : public ParallelContext {
 public:
  DeviceContext(const ParallelConfig& config, ExpertMap map, int rank,
                const DeviceContextOptions& options, int max_blocks, bool own_gpus,
                std::unique_ptr<ExchangeBuffers> buffers, std::unique_ptr<DeviceExpertTable> table,
                std::unique_ptr<ExchangeTransport> transport)
      : ParallelContext(config, std::move(map), rank,
                        ContextOptions{Memory::kDevice, options.hidden, options.top_k,
                                       options.max_tokens_per_step}),
        device_(options.device),
        max_blocks_(max_blocks),
        own_gpus_(own_gpus),
        timeout_ns_(static_cast<uint64_t>(absl::ToInt64Nanoseconds(options.timeout))),
        buffers_(std::move(buffers)),
        table_(std::move(table)),
        transport_(std::move(transport)),
        interrupt_(options.interrupt),
        tp_(this),
        ep_(this) {
    SetStepTokens(options.max_tokens_per_step);
  }

  ~DeviceContext() override {
    // Peers write into this rank's buffers only before flags this rank waits
    // for, so once its own work is done the buffers may go.
    cudaSetDevice(device_);
    cudaDeviceSynchronize();
  }

  TensorParallel& tp() override { return tp_; }
  ExpertParallel& ep() override { return ep_; }
  std::string backend() const override { return transport_->name(); }

  void SetExpertMap(ExpertMap map) override {
    map_status_ = cudaSetDevice(device_) == cudaSuccess
                      ? table_->Upload(map)
                      : absl::InternalError("cudaSetDevice failed");
    if (map_status_.ok()) ParallelContext::SetExpertMap(std::move(map));
  }

  absl::Status CheckHealth() override {
    if (!broken_.ok()) return broken_;
    if (absl::Status st = transport_->Health(); !st.ok()) return Break(st);
    int32_t word = 0;
    const cudaError_t err =
        cudaMemcpy(&word, buffers_->state().error, sizeof(word), cudaMemcpyDeviceToHost);
    if (err != cudaSuccess) {
      return Break(absl::UnavailableError(
          absl::StrCat("device context: the device failed: ", cudaGetErrorString(err))));
    }
    if (word != 0) {
      return Break(absl::UnavailableError(absl::StrCat("device context rank ", rank_, ": ",
                                                       DescribeDeviceError(word),
                                                       "; the context is broken")));
    }
    return absl::OkStatus();
  }

  absl::Status WaitForStream(void* stream) override {
    const cudaStream_t s = static_cast<cudaStream_t>(stream);
    FLOTILLA_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    // Spin briefly (a decode step ends within microseconds of its last
    // kernel), then check the interrupt and the transport between short naps.
    for (int polls = 0;; ++polls) {
      const cudaError_t done = cudaStreamQuery(s);
      if (done == cudaSuccess) return CheckHealth();
      if (done != cudaErrorNotReady) {
        return Break(absl::UnavailableError(
            absl::StrCat("device context: the device failed: ", cudaGetErrorString(done))));
      }
      if (polls < 1000) {
        std::this_thread::yield();
        continue;
      }
      absl::Status why = transport_->Health();
      if (why.ok() && interrupt_ != nullptr && interrupt_->load()) {
        why = absl::UnavailableError(
            "the step was interrupted: the coordinator dropped the instance or its session ended");
      }
      if (!why.ok()) {
        return Break(absl::UnavailableError(
            absl::StrCat("device context rank ", rank_, ": ", why.message())));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  void Abort() override {
    cudaSetDevice(device_);
    transport_->Abort();
    if (broken_.ok()) broken_ = absl::UnavailableError("device context: aborted");
  }

  // `residual` null: AllReduce; else AllReduceAdd.
  absl::Status AllReduce(float* data, int64_t count, void* stream, float* residual) {
    if (count < 0 || (count > 0 && data == nullptr)) {
      return absl::InvalidArgumentError("tp().AllReduce: bad buffer or count");
    }
    const auto s = static_cast<cudaStream_t>(stream);
    if (config_.tp_size() == 1) {
      if (residual == nullptr) return absl::OkStatus();
      return CudaStatus(kernels::cuda::LaunchEpAddAndZero(residual, data, count, s),
                        "all-reduce add");
    }
    FLOTILLA_RETURN_IF_ERROR(Usable());
    return transport_->AllReduce(Launch(), data, count, s, residual);
  }

  bool DeviceLines(kc::EpLaunch* launch) {
    if (config_.tp_size() == 1 || !own_gpus_ || !Usable().ok()) return false;
    *launch = Launch();
    return transport_->DeviceLines(launch);
  }

  void SetStepTokens(int64_t tokens) {
    if (tokens < 0 || tokens > options_.max_tokens_per_step) {
      step_status_ = absl::InvalidArgumentError(
          absl::StrCat("SetStepTokens(", tokens,
                       "): outside [0, max_tokens_per_step = ", options_.max_tokens_per_step, "]"));
      return;
    }
    step_status_ = absl::OkStatus();
    step_tokens_ = tokens;
    cap_ = static_cast<int>(buffers_->sizes().CapFor(tokens));
  }

  absl::StatusOr<ExpertRows> Dispatch(int layer, const void* x, const int32_t* topk_ids,
                                      const float* topk_w, int64_t tokens, void* stream) {
    FLOTILLA_RETURN_IF_ERROR(Usable());
    FLOTILLA_RETURN_IF_ERROR(step_status_);
    FLOTILLA_RETURN_IF_ERROR(map_status_);
    if (layer < 0 || layer >= map_.num_layers()) {
      return absl::InvalidArgumentError(absl::StrCat("Dispatch: layer ", layer, " out of range"));
    }
    if (tokens < 0 || tokens > step_tokens_) {
      return absl::InvalidArgumentError(
          absl::StrCat("Dispatch: ", tokens, " tokens, but SetStepTokens allowed ", step_tokens_));
    }
    FLOTILLA_RETURN_IF_ERROR(transport_->Dispatch(
        Launch(), static_cast<const uint16_t*>(x), topk_ids, topk_w, static_cast<int>(tokens),
        table_->first(layer), table_->reps(layer), static_cast<cudaStream_t>(stream)));
    pending_layer_ = layer;
    pending_tokens_ = static_cast<int>(tokens);
    ExpertRows rows;
    rows.x = buffers_->recv().x;
    rows.slot = buffers_->state().slot;
    rows.ones = buffers_->state().ones;
    rows.rows = static_cast<int64_t>(config_.world_size()) * cap_;
    rows.out = buffers_->state().out;
    return rows;
  }

  absl::Status Combine(int layer, float* y, void* stream) {
    FLOTILLA_RETURN_IF_ERROR(Usable());
    if (pending_layer_ < 0) return absl::FailedPreconditionError("Combine without a Dispatch");
    if (layer != pending_layer_) {
      return absl::InvalidArgumentError(
          absl::StrCat("Combine(layer ", layer, ") after Dispatch(layer ", pending_layer_, ")"));
    }
    pending_layer_ = -1;
    return transport_->Combine(Launch(), y, pending_tokens_, static_cast<cudaStream_t>(stream));
  }

 private:
  absl::Status Break(absl::Status status) {
    broken_ = std::move(status);
    return broken_;
  }

  // Checks the context is not broken and makes its GPU current (only when
  // another one is, so that nothing extra happens inside a graph capture).
  absl::Status Usable() {
    if (!broken_.ok()) return broken_;
    int current = -1;
    FLOTILLA_CUDA_RETURN_IF_ERROR(cudaGetDevice(&current));
    if (current == device_) return absl::OkStatus();
    return CudaStatus(cudaSetDevice(device_), "cudaSetDevice");
  }

  kc::EpLaunch Launch() const {
    kc::EpLaunch l;
    l.shape.world = config_.world_size();
    l.shape.rank = rank_;
    l.shape.tp_size = config_.tp_size();
    l.shape.tp_rank = config_.tp_rank_of(rank_);
    l.shape.hidden = options_.hidden;
    l.shape.top_k = options_.top_k;
    l.shape.num_experts = map_.num_experts();
    l.shape.cap = cap_;
    l.shape.max_blocks = max_blocks_;
    l.self = buffers_->recv();
    l.state = buffers_->state();
    l.timeout_ns = timeout_ns_;
    return l;
  }

  const int device_;
  const int max_blocks_;  // grid cap agreed by all ranks
  const bool own_gpus_;   // no two ranks share a GPU (EveryRankOwnsItsGpu)
  const uint64_t timeout_ns_;
  std::unique_ptr<ExchangeBuffers> buffers_;
  std::unique_ptr<DeviceExpertTable> table_;
  std::unique_ptr<ExchangeTransport> transport_;
  std::shared_ptr<const std::atomic<bool>> interrupt_;
  DeviceTensorParallel tp_;
  DeviceExpertParallel ep_;
  int64_t step_tokens_ = 0;
  int cap_ = 0;
  int pending_layer_ = -1;
  int pending_tokens_ = 0;
  absl::Status step_status_;
  absl::Status map_status_;
  absl::Status broken_;
};

int DeviceTensorParallel::size() const { return context_->config().tp_size(); }
int DeviceTensorParallel::rank() const { return context_->config().tp_rank_of(context_->rank()); }
absl::Status DeviceTensorParallel::AllReduce(float* data, int64_t count, void* stream) {
  return context_->AllReduce(data, count, stream, nullptr);
}
absl::Status DeviceTensorParallel::AllReduceAdd(float* part, float* residual, int64_t count,
                                                void* stream) {
  if (count > 0 && residual == nullptr) {
    return absl::InvalidArgumentError("tp().AllReduceAdd: no residual");
  }
  return context_->AllReduce(part, count, stream, residual);
}

bool DeviceTensorParallel::DeviceLines(kc::EpLaunch* launch) {
  return context_->DeviceLines(launch);
}

void DeviceExpertParallel::SetStepTokens(int64_t max_tokens_any_rank) {
  context_->SetStepTokens(max_tokens_any_rank);
}
absl::StatusOr<ExpertRows> DeviceExpertParallel::Dispatch(int layer, const void* x,
                                                          const int32_t* topk_ids,
                                                          const float* topk_w, int64_t tokens,
                                                          void* stream) {
  return context_->Dispatch(layer, x, topk_ids, topk_w, tokens, stream);
}
absl::Status DeviceExpertParallel::Combine(int layer, float* y, void* stream) {
  return context_->Combine(layer, y, stream);
}

absl::Status ValidateArguments(const ParallelConfig& config, const ExpertMap& map, int rank,
                               const comm::Communicator& host,
                               const DeviceContextOptions& options) {
  if (host.size() != config.world_size() || host.rank() != rank) {
    return absl::InvalidArgumentError(
        absl::StrCat("device context: the host communicator is rank ", host.rank(), " of ",
                     host.size(), ", the context rank ", rank, " of ", config.world_size()));
  }
  if (map.world_size() != config.world_size() || map.num_layers() < 1) {
    return absl::InvalidArgumentError("device context: the expert map does not fit the world");
  }
  if (options.hidden <= 0 || options.hidden % 8 != 0 || options.top_k < 1 || options.top_k > 8 ||
      options.max_tokens_per_step < 0 || options.max_tokens_per_step > (int64_t{1} << 24) ||
      options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "device context: hidden must be a positive multiple of 8, top_k in [1, 8], "
        "max_tokens_per_step in [0, 2^24] and the timeout positive");
  }
  if (config.world_size() > kc::kEpMaxRanks) {
    return absl::InvalidArgumentError(
        absl::StrCat("device context: at most ", kc::kEpMaxRanks, " ranks"));
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess) {
    cudaGetLastError();
    devices = 0;
  }
  if (options.device < 0 || options.device >= devices) {
    return absl::FailedPreconditionError(absl::StrCat(
        "device context: CUDA device ", options.device, " does not exist (", devices, " found)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ExchangeTransport>> MakeTransport(
    DeviceTransport kind, comm::Communicator& host, const ParallelConfig& config,
    const ExchangeBuffers& buffers, const DeviceContextOptions& options) {
  if (kind == DeviceTransport::kCudaIpc) {
    return comm::CudaIpcTransport::Create(host, buffers.recv_base(), buffers.recv());
  }
#if FLOTILLA_WITH_NCCL
  const comm::NcclStagingSizes staging{buffers.sizes().world, buffers.sizes().hidden,
                                       buffers.sizes().cap_max()};
  return comm::NcclTransport::Create(host, config, staging, options.timeout, options.interrupt);
#else
  return absl::FailedPreconditionError("device context: this build has no NCCL");
#endif
}

}  // namespace

absl::StatusOr<std::unique_ptr<ParallelContext>> CreateDeviceContext(
    const ParallelConfig& config, ExpertMap map, int rank, comm::Communicator& host,
    const DeviceContextOptions& options) {
  FLOTILLA_RETURN_IF_ERROR(ValidateArguments(config, map, rank, host, options));
  FLOTILLA_CUDA_RETURN_IF_ERROR(cudaSetDevice(options.device));
  const std::vector<int64_t> fingerprint = {config.world_size(),
                                            config.tp_size(),
                                            options.hidden,
                                            options.top_k,
                                            options.max_tokens_per_step,
                                            map.num_layers(),
                                            map.num_experts(),
                                            options.flagged_lines ? 1 : 0};
  FLOTILLA_ASSIGN_OR_RETURN(const RankIdentity mine, LocalIdentity(options.device, fingerprint));
  FLOTILLA_ASSIGN_OR_RETURN(const std::vector<RankIdentity> ranks, ExchangeIdentities(host, mine));
  FLOTILLA_ASSIGN_OR_RETURN(const DeviceTransport kind,
                            ChooseTransport(host, ranks, options.device, options.transport));

  ExchangeSizes sizes;
  sizes.world = config.world_size();
  sizes.tp = config.tp_size();
  sizes.hidden = options.hidden;
  sizes.top_k = options.top_k;
  sizes.max_tokens = options.max_tokens_per_step;
  sizes.ipc = kind == DeviceTransport::kCudaIpc;
  sizes.flagged_lines = options.flagged_lines;
  absl::StatusOr<std::unique_ptr<ExchangeBuffers>> buffers = ExchangeBuffers::Create(sizes);
  absl::StatusOr<std::unique_ptr<DeviceExpertTable>> table =
      buffers.ok() ? DeviceExpertTable::Create(map) : buffers.status();
  // A rank that could not allocate must not leave its peers waiting in the
  // exchanges that follow: every rank learns of it here.
  FLOTILLA_ASSIGN_OR_RETURN(const bool all_ready, AllRanksAgree(host, table.ok()));
  FLOTILLA_RETURN_IF_ERROR(table.status());
  if (!all_ready) {
    return absl::UnavailableError("device context: a peer could not allocate its buffers");
  }
  FLOTILLA_ASSIGN_OR_RETURN(std::unique_ptr<ExchangeTransport> transport,
                            MakeTransport(kind, host, config, **buffers, options));
  return std::unique_ptr<ParallelContext>(new DeviceContext(
      config, std::move(map), rank, options, AgreedMaxBlocks(ranks), EveryRankOwnsItsGpu(ranks),
      std::move(*buffers), std::move(*table), std::move(transport)));
}

}  // namespace flotilla::parallel
