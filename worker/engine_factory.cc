#include "worker/engine_factory.h"

#include <algorithm>

#include "common/expert_map_proto.h"
#include "common/status.h"
#include "worker/engine/cpu_engine.h"
#include "worker/parallel/host_context.h"

namespace flotilla::worker {
namespace {

class CpuEngineFactory final : public EngineFactory {
 public:
  absl::StatusOr<RankEngine> Create(EngineSpec spec) override {
    const cluster::Assignment& a = *spec.assignment;
    const WorkerOptions& options = *spec.options;
    const ModelConfig c = spec.weights.config;
    RankEngine built;
    if (spec.comm != nullptr) {
      // Host memory over the instance's communicator.
      FLOTILLA_ASSIGN_OR_RETURN(ExpertMap map, ExpertMapFromProto(a.expert_map()));
      parallel::ContextOptions po;
      po.memory = parallel::Memory::kHost;
      po.hidden = c.hidden_size;
      po.top_k = c.num_experts_per_tok;
      po.max_tokens_per_step = MaxStepTokens(a);
      FLOTILLA_ASSIGN_OR_RETURN(built.context, parallel::CreateHostContext(
                                                   *spec.parallel, std::move(map), spec.comm, po));
    }
    CpuEngineOptions eo;
    eo.kv_block_size = options.kv_block_size;
    eo.prefix_cache = options.prefix_cache;
    eo.kv_host_cache_bytes = static_cast<int64_t>(options.kv_host_cache_gb * (1 << 30));
    FLOTILLA_ASSIGN_OR_RETURN(eo.kv_cache_dtype, KvCacheDtypeOf(a, options));
    FLOTILLA_ASSIGN_OR_RETURN(eo.moe_activation, MoeActivationOf(a, options));
    const int64_t kv_heads = c.num_key_value_heads / a.tp_size();
    const int64_t seqs = std::max<uint32_t>(1, a.max_sequences());
    eo.kv_num_blocks = a.kv_blocks() > 0
                           ? a.kv_blocks()
                           : CpuEngine::KvBlocksFor(c, kv_heads, eo.kv_block_size, seqs,
                                                    std::max<int64_t>(1, options.kv_tokens / seqs),
                                                    eo.prefix_cache);
    FLOTILLA_ASSIGN_OR_RETURN(built.engine, CpuEngine::Create(std::move(spec.weights), eo,
                                                              spec.pool, built.context.get()));
    return built;
  }
};

}  // namespace

absl::StatusOr<KvCacheDtype> KvCacheDtypeOf(const cluster::Assignment& a,
                                            const WorkerOptions& options) {
  const bool coordinator_chose = !a.kv_cache_dtype().empty() && a.kv_cache_dtype() != "auto";
  return ParseKvCacheDtype(coordinator_chose ? a.kv_cache_dtype() : options.kv_cache_dtype);
}

absl::StatusOr<MoeActivation> MoeActivationOf(const cluster::Assignment& a,
                                              const WorkerOptions& options) {
  const bool coordinator_chose = !a.moe_activation().empty() && a.moe_activation() != "auto";
  return ParseMoeActivation(coordinator_chose ? a.moe_activation() : options.moe_activation);
}

int64_t StepTokenBudget(const cluster::Assignment& a) {
  return std::max<int64_t>({1, a.max_batch_tokens(), a.scheduler_policy().idle_prefill_tokens()});
}

int64_t MaxStepTokens(const cluster::Assignment& a) {
  return StepTokenBudget(a) + std::max<uint32_t>(1, a.max_sequences());
}

std::unique_ptr<EngineFactory> MakeCpuEngineFactory() {
  return std::make_unique<CpuEngineFactory>();
}

EngineFactories DefaultEngineFactories() {
  EngineFactories factories;
  factories.emplace("cpu", MakeCpuEngineFactory());
  factories.emplace("cuda", MakeCudaEngineFactory());
  return factories;
}

}  // namespace flotilla::worker
