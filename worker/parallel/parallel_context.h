// The one seam through which an engine's layer is split across ranks.
//
// Every engine runs the same layer sequence; with W > 1 ranks it calls:
//   own heads' attention -> tp().AllReduceAdd(o_proj partial) -> router ->
//   ep().Dispatch(x, topk) -> its local experts on the received rows ->
//   ep().Combine(-> y) -> residual += y.
// With W = 1 there is no context at all (nullptr): the engine's partial
// results are already complete and it keeps its fused single-rank path.
//
// A context moves bytes and never calls back into an engine. Operations are
// stream-ordered: a host context completes them before returning (streams
// ignored); a device context only enqueues them on `stream` (a cudaStream_t
// passed as void*, so this header needs no CUDA), keeps counts on the
// device, and uses buffers of a fixed capacity, so a whole decode step,
// communication included, can be captured in one CUDA graph.
//
// Lockstep: every rank of the instance calls the same operations in the same
// order every layer of every step, also with no tokens of its own.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/expert_map.h"
#include "common/parallel_config.h"

namespace flotilla::kernels::cuda {
struct EpLaunch;
}  // namespace flotilla::kernels::cuda

namespace flotilla::parallel {

// Where the buffers handed to a context live, and their element types:
//   kHost:   host memory; activations f32.
//   kDevice: device memory of the context's GPU; experts' input bf16
//            (uint16_t bits), everything else f32.
enum class Memory { kHost, kDevice };

// The rows a rank received in Dispatch, to run through its own experts.
struct ExpertRows {
  // Experts' input rows [rows, hidden]: f32 (host) or bf16 (device).
  const void* x = nullptr;
  // Per row: the slot (ExpertLocation::slot on this rank for the layer) of
  // the expert to run; -1 marks a padding row to skip (device only).
  const int32_t* slot = nullptr;
  // Per row: 1.0 for a real row, 0.0 for padding, so a kernel that scales
  // by a router weight (kernels::cuda::LaunchMoeLayer with top_k = 1) can be
  // handed these as its weights. Outputs stay unweighted: Combine applies
  // the router weights.
  const float* ones = nullptr;
  // Rows the arrays span. Host: exactly the rows received. Device: a bound
  // fixed by the step's token bound (see SetStepTokens); the real per-peer
  // counts stay on the device and the rest are padding rows.
  int64_t rows = 0;
  // Where the experts write expert(x) (down bias included, not weighted)
  // [rows, hidden] f32. Dispatch zeroes it, so kernels may add into it.
  float* out = nullptr;
};

class TensorParallel {
 public:
  virtual ~TensorParallel() = default;
  virtual int size() const = 0;
  virtual int rank() const = 0;
  // Sums `count` f32 of `data` in place over this rank's TP group; every rank
  // of the group gets the same bits (parts summed in TP-rank order). A group
  // of one returns at once.
  virtual absl::Status AllReduce(float* data, int64_t count, void* stream = nullptr) = 0;
  // The same sum of `part`, added into `residual` (residual[i] += sum[i]);
  // `part` is left all zero, so the next producer may add into it. The
  // device context does both in the exchange's own kernel.
  virtual absl::Status AllReduceAdd(float* part, float* residual, int64_t count,
                                    void* stream = nullptr) = 0;
  // Device contexts whose exchange a kernel can run itself (CUDA IPC with
  // flagged lines, a group of more than one, no two ranks on one GPU, since
  // the kernel's blocks wait for their peers'): fills `launch` for a producing
  // kernel that sums its own output over the group
  // (kernels::cuda::LaunchLinearTpSum) and returns true. Otherwise false, and
  // the caller produces a part and calls AllReduceAdd.
  virtual bool DeviceLines(kernels::cuda::EpLaunch* launch) {
    (void)launch;
    return false;
  }
};

class ExpertParallel {
 public:
  virtual ~ExpertParallel() = default;

  // The largest number of tokens any rank of the instance runs in the coming
  // step (every rank passes the same value). Device contexts size the step's
  // buffers and ExpertRows::rows from it; host contexts ignore it. Must not
  // exceed ContextOptions::max_tokens_per_step.
  virtual void SetStepTokens(int64_t max_tokens_any_rank) = 0;

  // Sends each (token, k) pair of this rank's share of `tokens` (the tokens
  // t with t % tp_size == tp_rank: a TP group holds identical tokens, each is
  // sent once) to a rank holding expert topk_ids[t * k + j] (replicas chosen
  // deterministically). x [tokens, hidden] (f32 host / bf16 device),
  // topk_ids int32 [tokens, k] global expert ids, topk_w f32 [tokens, k].
  // Returns the rows this rank must run through its experts, valid until the
  // matching Combine.
  virtual absl::StatusOr<ExpertRows> Dispatch(int layer, const void* x, const int32_t* topk_ids,
                                              const float* topk_w, int64_t tokens,
                                              void* stream = nullptr) = 0;

  // After the experts filled ExpertRows::out: returns every output to the
  // rank that sent its row and writes, for every token of the last Dispatch
  // (the TP group's shares joined), y[t] = sum over its k experts in
  // ascending expert id of topk_w * out (f32 [tokens, hidden], overwritten).
  virtual absl::Status Combine(int layer, float* y, void* stream = nullptr) = 0;
};

struct ContextOptions {
  Memory memory = Memory::kHost;
  int hidden = 0;                    // H of the model
  int top_k = 0;                     // experts per token
  int64_t max_tokens_per_step = 0;   // most tokens a rank runs in one step
};

class ParallelContext {
 public:
  virtual ~ParallelContext() = default;
  const ParallelConfig& config() const { return config_; }
  int rank() const { return rank_; }
  const ContextOptions& options() const { return options_; }
  const ExpertMap& expert_map() const { return map_; }
  // Replaces the expert map at a step boundary (same experts per rank).
  virtual void SetExpertMap(ExpertMap map) { map_ = std::move(map); }

  virtual TensorParallel& tp() = 0;
  virtual ExpertParallel& ep() = 0;
  // Names the transport, e.g. "host:ucx", "cuda-ipc", "nccl" (logs, Hello).
  virtual std::string backend() const = 0;
  // Device contexts: a wait on a peer that ran past its bound (a dead or stuck
  // rank) is recorded on the device and reported here as UNAVAILABLE once the
  // caller has synchronised the stream (after a step); the context is then
  // broken for good. Host contexts report failures from each call instead.
  virtual absl::Status CheckHealth() { return absl::OkStatus(); }
  // Device contexts: waits until the work enqueued on `stream` (a
  // cudaStream_t) has finished, then CheckHealth(). The wait polls instead of
  // blocking, so that it ends early, UNAVAILABLE and the context broken for
  // good, when the context's interrupt is raised (the coordinator dropped the
  // generation, or the session ended) or the transport reports a failure.
  // The stream may then still hold kernels waiting for a dead peer: the
  // caller destroys every CUDA graph that captured this context's exchanges
  // (NCCL waits for those before it aborts), calls Abort(), and the stream
  // drains. Host contexts return at once.
  virtual absl::Status WaitForStream(void* stream) { return absl::OkStatus(); }
  // Ends the exchanges in flight without waiting for the peers (their
  // kernels exit) and breaks the context: for a step that gave up, or an
  // engine torn down whose peers may be gone. No CUDA graph that captured
  // the exchanges may be alive. Called on the thread that runs the engine.
  virtual void Abort() {}

 protected:
  ParallelContext(ParallelConfig config, ExpertMap map, int rank, ContextOptions options)
      : config_(config), map_(std::move(map)), rank_(rank), options_(options) {}
  ParallelConfig config_;
  ExpertMap map_;
  int rank_;
  ContextOptions options_;
};

}  // namespace flotilla::parallel
