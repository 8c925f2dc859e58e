// The "cuda" factory: the whole model on one GPU, or a sharded GPU rank whose
// exchanges run on device memory (CUDA IPC on one node, NCCL across nodes).
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/comm_names.h"
#include "common/expert_map_proto.h"
#include "common/status.h"
#include "kernels/cuda/moe.h"
#include "spdlog/spdlog.h"
#include "worker/engine/cuda_engine.h"
#include "worker/engine_factory.h"
#include "worker/parallel/device_context.h"

namespace flotilla::worker {
namespace {

// The coordinator names the transport for every GPU rank with peers; an
// unknown value is refused rather than guessed.
absl::StatusOr<parallel::DeviceTransport> TransportOf(cluster::DeviceTransport transport) {
  switch (transport) {
    case cluster::DEVICE_TRANSPORT_CUDA_IPC:
      return parallel::DeviceTransport::kCudaIpc;
    case cluster::DEVICE_TRANSPORT_NCCL:
      return parallel::DeviceTransport::kNccl;
    default:
      return absl::InvalidArgumentError(absl::StrCat("the coordinator asked for device transport ",
                                                     DeviceTransportName(transport),
                                                     "; this worker joins cuda-ipc or nccl"));
  }
}

class CudaEngineFactory final : public EngineFactory {
 public:
  // A synthetic model is generated on the GPU: no host copy.
  bool WantsHostWeights(const ModelSource& model) const override {
    return model.synthetic() == nullptr;
  }

  absl::StatusOr<RankEngine> Create(EngineSpec spec) override {
    const cluster::Assignment& a = *spec.assignment;
    const WorkerOptions& options = *spec.options;
    const ModelConfig& c = spec.weights.config;
    CudaEngineOptions co;
    co.device = options.cuda_device;
    co.kv_block_size = static_cast<int>(options.kv_block_size);
    co.prefix_cache = options.prefix_cache;
    co.kv_host_cache_bytes = static_cast<int64_t>(options.kv_host_cache_gb * (1 << 30));
    co.deterministic = options.deterministic;
    if (!options.tp_sum_in_projection) co.tp_sum_in_projection_max_tokens = 0;
    if (options.moe_gemm_min_pairs.has_value()) {
      co.moe_tuning.gemm_min_pairs_per_expert = *options.moe_gemm_min_pairs;
    }
    FLOTILLA_ASSIGN_OR_RETURN(co.kv_cache_dtype, KvCacheDtypeOf(a, options));
    FLOTILLA_ASSIGN_OR_RETURN(const MoeActivation moe_activation, MoeActivationOf(a, options));
    if (moe_activation == MoeActivation::kFp8) {
      return absl::InvalidArgumentError(
          "--moe-activation fp8: the CUDA engine's MoE kernels take bf16/f16 activations only "
          "(on Hopper FP8 mma.sync runs as f16 after conversion: measured slower, "
          "kernels/moe_notes.md); use bf16 or auto");
    }
    co.max_sequences = static_cast<int>(std::max<uint32_t>(1, a.max_sequences()));
    co.max_context = a.max_model_len();
    co.gpu_memory_utilization = options.gpu_memory_utilization;
    co.spare_expert_slots = static_cast<int>(a.redundant_experts());
    co.max_batch_tokens = static_cast<int>(MaxStepTokens(a));
    RankEngine built;
    if (spec.comm != nullptr) {
      // The host communicator only bootstraps the device exchanges.
      FLOTILLA_ASSIGN_OR_RETURN(ExpertMap map, ExpertMapFromProto(a.expert_map()));
      parallel::DeviceContextOptions dco;
      dco.device = options.cuda_device;
      dco.hidden = c.hidden_size;
      dco.top_k = c.num_experts_per_tok;
      dco.max_tokens_per_step = co.max_batch_tokens;
      dco.timeout = options.comm_timeout;
      dco.interrupt = spec.interrupt;
      FLOTILLA_ASSIGN_OR_RETURN(dco.transport, TransportOf(spec.start->comm().device_transport()));
      FLOTILLA_ASSIGN_OR_RETURN(
          built.context,
          parallel::CreateDeviceContext(*spec.parallel, std::move(map), a.rank(), *spec.comm, dco));
      co.parallel = built.context.get();
      spdlog::info("rank {} exchanges over {}", a.rank(), built.context->backend());
    }
    std::unique_ptr<CudaEngine> engine;
    if (const SyntheticModelSpec* synthetic = spec.model->synthetic()) {
      FLOTILLA_ASSIGN_OR_RETURN(engine, CudaEngine::CreateFromSyntheticCheckpoint(
                                            synthetic->config, synthetic->weights(), co));
    } else {
      FLOTILLA_ASSIGN_OR_RETURN(engine, CudaEngine::Create(spec.weights, co));
    }
    spdlog::info("rank {} KV cache ({}): {}; {} tokens per sequence at most", a.rank(),
                 KvCacheDtypeName(co.kv_cache_dtype), engine->KvPoolsSummary(),
                 engine->MaxSequenceLength());
    built.engine = std::move(engine);
    return built;
  }
};

}  // namespace

std::unique_ptr<EngineFactory> MakeCudaEngineFactory() {
  return std::make_unique<CudaEngineFactory>();
}

}  // namespace flotilla::worker
