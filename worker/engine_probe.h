// Engine probe: times the engine itself, outside the serving loop's
// scheduling, so a benchmark can put served latencies next to what the engine
// alone needs for the same batch (admin MeasureEngine). Every engine call goes
// through ProbeDecodeStep / ProbePrefill, which make the same calls the
// serving loop makes for that work; when the serving path changes (e.g. to
// sample on the device), change them with it so the figures stay comparable.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/cluster.pb.h"
#include "worker/engine/engine.h"

namespace flotilla::worker {

// What the probe may use of the engine beside the running sequences.
struct ProbeLimits {
  int64_t kv_blocks_available = 0;  // blocks it may hold at once
  int64_t max_batch_tokens = 512;   // the serving loop's prefill chunk (step token budget)
  int64_t max_sequences = 64;       // decode batches are clamped to this
};

// How the probe's engine steps take part in the lockstep of a sharded
// instance, where every rank runs the same probe step by step. The defaults
// are those of an instance of one rank.
struct ProbeLockstep {
  // Called before every engine step with the step's tokens: on a sharded
  // instance, the step-token agreement a serving step goes through. An error
  // stops the probe.
  std::function<absl::Status(int64_t step_tokens)> before_step;
  // Tokens are drawn as a DP-group leader draws them; TP peers (false) skip
  // lm_head as they do when serving.
  bool sample = true;
  // The TP group splits lm_head as serving steps do (StepItem::group_logits,
  // agreed by every rank): decode steps of at most kMaxGroupLogitRows
  // sequences and a prompt's last chunk mark their items.
  bool group_logits = false;
};

// One decode step of `sequences`, token `tokens[i]` appended to sequence i,
// logits of the last position: the serving loop's decode step.
absl::Status ProbeDecodeStep(Engine& engine, const std::vector<int64_t>& sequences,
                             const std::vector<int32_t>& tokens,
                             const ProbeLockstep& lockstep = {});

// Prefills `prompt` into `sequence` in chunks of at most `chunk_tokens`, as the
// serving loop does (logits of the last position of the last chunk only).
absl::Status ProbePrefill(Engine& engine, int64_t sequence, const std::vector<int32_t>& prompt,
                          int64_t chunk_tokens, const ProbeLockstep& lockstep = {});

// Runs the measurement `request` asks for with temporary sequences (random
// token ids from a fixed seed, so every rank of an instance runs the same
// steps on the same ids), freed before it returns, whatever happens. Batch
// sizes above limits.max_sequences are clamped to it. INVALID_ARGUMENT for
// lengths past the engine's context or an unreasonable request;
// RESOURCE_EXHAUSTED when the temporary sequences need more KV blocks than
// limits.kv_blocks_available (nothing is run then: these checks depend only
// on the request, the limits and the model, so ranks given the same ones
// agree). Fills the timings only (decode, prefill, wall_ms).
absl::StatusOr<cluster::EngineMeasurement> MeasureEngine(
    Engine& engine, const cluster::MeasureEngineRequest& request, const ProbeLimits& limits,
    const ProbeLockstep& lockstep = {});

}  // namespace flotilla::worker
