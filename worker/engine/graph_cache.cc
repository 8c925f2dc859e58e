#include "worker/engine/graph_cache.h"

#include "worker/engine/cuda_status.h"

namespace flotilla {

absl::Status GraphCache::Launch(const Key& key, cudaStream_t stream,
                                const std::function<absl::Status()>& record) {
  auto g = graphs_.find(key);
  if (g == graphs_.end()) {
    cudaGraphExec_t exec = nullptr;
    if (absl::Status captured = Capture(stream, record, &exec); !captured.ok()) return captured;
    g = graphs_.emplace(key, exec).first;
  }
  return CudaStatus(cudaGraphLaunch(g->second, stream), "cudaGraphLaunch");
}

absl::Status GraphCache::Capture(cudaStream_t stream, const std::function<absl::Status()>& record,
                                 cudaGraphExec_t* exec) {
  cudaGraph_t graph = nullptr;
  if (absl::Status begun =
          CudaStatus(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal),
                     "cudaStreamBeginCapture");
      !begun.ok()) {
    return begun;
  }
  const absl::Status recorded = record();
  const cudaError_t end = cudaStreamEndCapture(stream, &graph);
  if (!recorded.ok() || end != cudaSuccess) {
    if (graph != nullptr) cudaGraphDestroy(graph);
    return !recorded.ok() ? recorded : CudaStatus(end, "cudaStreamEndCapture");
  }
  const cudaError_t instantiated = cudaGraphInstantiate(exec, graph, 0);
  cudaGraphDestroy(graph);
  return CudaStatus(instantiated, "cudaGraphInstantiate");
}

void GraphCache::Clear() {
  for (auto& [key, exec] : graphs_) cudaGraphExecDestroy(exec);
  graphs_.clear();
}

}  // namespace flotilla
