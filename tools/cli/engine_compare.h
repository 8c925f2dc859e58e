// `flotilla bench serve --engine-compare`: puts served figures next to the
// engine's own times for the same work, measured on the serving worker
// (admin MeasureEngine), so one JSON line shows the serving overhead.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <vector>

#include "proto/cluster.pb.h"

namespace flotilla::cli {

// What the load did, as the comparison needs it.
struct ServedLoad {
  int batch = 1;          // decode batch it ran at (the concurrency, or mean requests in flight)
  int dp_groups = 1;      // the instance's DP groups, which share the batch
  int prompt_tokens = 0;  // mean prompt length
  int64_t output_tokens = 0;  // every token streamed back
  int64_t prompts = 0;        // requests that got a first token (prefilled)
  double elapsed_s = 0;
  double itl_p50_ms = 0;
  double ttft_p50_ms = 0;
};

// Decode batch sizes worth measuring for a served batch: 1, the batch and
// the powers of two around it (the CUDA engine's graph buckets).
std::vector<uint32_t> CompareBatchSizes(int batch);

// The decode batch of one DP group when `batch` requests spread over `dp_groups`.
int GroupBatch(int batch, int dp_groups);

// The measurement for a load: decode at `context_tokens` for
// CompareBatchSizes of a DP group's batch, prefill of the mean prompt length.
cluster::MeasureEngineRequest CompareRequest(const ServedLoad& load, int context_tokens, int steps);

// The engine's figures ("engine") and the comparison ("engine_compare").
// The measurement is one DP group's (m.dp_groups of them, each running its
// share of the load in lockstep): served ITL p50 / engine step at a group's
// batch; TTFT p50 - engine prefill; engine-only output rate of the instance
// = output tokens / (decode steps x step time + prompts per group x prefill
// time), decode steps = (output tokens - prompts) / (group batch x groups),
// that rate per DP group, and served rate / the instance's rate. Batches
// above the instance's max_sequences were measured at max_sequences: the
// largest measured batch not above the group's batch is used, and named.
nlohmann::json EngineComparison(const ServedLoad& load, const cluster::EngineMeasurement& m);

}  // namespace flotilla::cli
