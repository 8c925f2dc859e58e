// Builds a rank's engine for its device: the "cpu" reference engine or the
// "cuda" engine. The runtime picks a factory by --device and never names an
// engine type; which factories exist is decided by the build
// (DefaultEngineFactories).
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "comm/communicator.h"
#include "common/parallel_config.h"
#include "kernels/cpu/thread_pool.h"
#include "proto/cluster.pb.h"
#include "worker/engine/engine.h"
#include "worker/engine/kv_cache_dtype.h"
#include "worker/engine/moe_activation.h"
#include "worker/model/model_source.h"
#include "worker/model/weights.h"
#include "worker/parallel/parallel_context.h"
#include "worker/worker_options.h"

namespace flotilla::worker {

// Everything one rank's engine is built from, at StartComm.
struct EngineSpec {
  const cluster::Assignment* assignment = nullptr;
  const cluster::StartComm* start = nullptr;
  const ParallelConfig* parallel = nullptr;
  const ModelSource* model = nullptr;
  // The rank's shard as loaded at the Assignment (only its config when the
  // factory generates a synthetic model on its device).
  ModelWeights weights;
  // The instance's host communicator; null for an instance of one rank.
  comm::Communicator* comm = nullptr;
  kernels::cpu::ThreadPool* pool = nullptr;
  const WorkerOptions* options = nullptr;
  // Raised when the coordinator drops this generation or the session ends:
  // device waits on peers give up then. May be null.
  std::shared_ptr<const std::atomic<bool>> interrupt;
};

struct RankEngine {
  // The layer exchanges of a rank of W > 1 (null otherwise); declared first
  // so that it outlives the engine that uses it.
  std::unique_ptr<parallel::ParallelContext> context;
  std::unique_ptr<Engine> engine;
};

class EngineFactory {
 public:
  virtual ~EngineFactory() = default;
  // Whether the Assignment must load the shard into host memory; false when
  // this factory generates `model` (a synthetic one) on its device instead.
  virtual bool WantsHostWeights(const ModelSource& model) const { return true; }
  // The engine (and for W > 1 its parallel context over spec.comm).
  virtual absl::StatusOr<RankEngine> Create(EngineSpec spec) = 0;
};

// The full-attention KV storage a rank's engine uses: the Assignment's
// (the coordinator's --kv-cache-dtype) unless it is empty or auto, then the
// worker's own flag; INVALID_ARGUMENT naming an unknown one.
absl::StatusOr<KvCacheDtype> KvCacheDtypeOf(const cluster::Assignment& a,
                                            const WorkerOptions& options);
// The experts' input precision likewise (the coordinator's --moe-activation
// unless empty or auto, then the worker's own).
absl::StatusOr<MoeActivation> MoeActivationOf(const cluster::Assignment& a,
                                              const WorkerOptions& options);

// The scheduler's token budget of a step (worker/scheduler.h): the
// Assignment's max_batch_tokens, or its idle_prefill_tokens for steps that
// carry no decode token when that is larger.
int64_t StepTokenBudget(const cluster::Assignment& a);
// The most tokens one step computes, what engines size their buffers for:
// that budget plus the decode tokens that may overrun it (one per sequence).
int64_t MaxStepTokens(const cluster::Assignment& a);

using EngineFactories = std::map<std::string, std::unique_ptr<EngineFactory>>;

std::unique_ptr<EngineFactory> MakeCpuEngineFactory();
// Defined by the CUDA build (cuda_engine_factory.cc); without CUDA its
// Create refuses (no_cuda_engine_factory.cc).
std::unique_ptr<EngineFactory> MakeCudaEngineFactory();
// "cpu" and "cuda".
EngineFactories DefaultEngineFactories();

}  // namespace flotilla::worker
