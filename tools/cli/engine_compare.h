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

// The measurement for a load: decode at `context_tokens` for
// CompareBatchSizes(load.batch), prefill of the mean prompt length.
cluster::MeasureEngineRequest CompareRequest(const ServedLoad& load, int context_tokens, int steps);

// The engine's figures ("engine") and the comparison ("engine_compare"):
// served ITL p50 / engine step at the served batch; TTFT p50 - engine
// prefill; engine-only output rate = output tokens / (decode steps x step
// time + prompts x prefill time), decode steps = (output tokens - prompts) /
// batch, and served rate / that rate. Batches above the instance's
// max_sequences were measured at max_sequences: the largest measured batch
// not above load.batch is used, and named.
nlohmann::json EngineComparison(const ServedLoad& load, const cluster::EngineMeasurement& m);

}  // namespace flotilla::cli
