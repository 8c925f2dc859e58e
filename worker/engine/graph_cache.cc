#include "worker/engine/graph_cache.h"

#include "absl/strings/str_cat.h"

namespace flotilla {
namespace {

absl::Status CudaError(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("cuda: ", what, ": ", cudaGetErrorString(err)));
}

}  // namespace

absl::Status GraphCache::Launch(const Key& key, cudaStream_t stream,
                                const std::function<absl::Status()>& record) {
  auto g = graphs_.find(key);
  if (g == graphs_.end()) {
    cudaGraphExec_t exec = nullptr;
    if (absl::Status captured = Capture(stream, record, &exec); !captured.ok()) return captured;
    g = graphs_.emplace(key, exec).first;
  }
  return CudaError(cudaGraphLaunch(g->second, stream), "cudaGraphLaunch");
}

absl::Status GraphCache::Capture(cudaStream_t stream, const std::function<absl::Status()>& record,
                                 cudaGraphExec_t* exec) {
  cudaGraph_t graph = nullptr;
  if (absl::Status begun =
          CudaError(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal),
                    "cudaStreamBeginCapture");
      !begun.ok()) {
    return begun;
  }
  const absl::Status recorded = record();
  const cudaError_t end = cudaStreamEndCapture(stream, &graph);
  if (!recorded.ok() || end != cudaSuccess) {
    if (graph != nullptr) cudaGraphDestroy(graph);
    return !recorded.ok() ? recorded : CudaError(end, "cudaStreamEndCapture");
  }
  const cudaError_t instantiated = cudaGraphInstantiate(exec, graph, 0);
  cudaGraphDestroy(graph);
  return CudaError(instantiated, "cudaGraphInstantiate");
}

void GraphCache::Clear() {
  for (auto& [key, exec] : graphs_) cudaGraphExecDestroy(exec);
  graphs_.clear();
}

}  // namespace flotilla
