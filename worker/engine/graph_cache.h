// A CudaEngine's captured decode and verify steps: one instantiated CUDA
// graph per key (padded batch, tokens per sequence, context bucket,
// sampling variant, the instance's step-token bound when sharded), captured
// from the stream the first time a key runs and replayed after. The caller
// makes the device current. Not thread-safe: one owner.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <map>
#include <tuple>

#include "absl/status/status.h"

namespace flotilla {

class GraphCache {
 public:
  using Key = std::tuple<int, int, int64_t, int, int64_t>;

  GraphCache() = default;
  ~GraphCache() { Clear(); }
  GraphCache(const GraphCache&) = delete;
  GraphCache& operator=(const GraphCache&) = delete;

  // Launches `key`'s graph on `stream`; the first time, captures what
  // `record` enqueues on `stream` (thread-local capture mode) as that graph.
  // A capture that fails (record's error or CUDA's) caches nothing.
  absl::Status Launch(const Key& key, cudaStream_t stream,
                      const std::function<absl::Status()>& record);
  // Destroys every graph (an exec still running is freed when it completes).
  void Clear();
  size_t size() const { return graphs_.size(); }

 private:
  absl::Status Capture(cudaStream_t stream, const std::function<absl::Status()>& record,
                       cudaGraphExec_t* exec);

  std::map<Key, cudaGraphExec_t> graphs_;
};

}  // namespace flotilla
