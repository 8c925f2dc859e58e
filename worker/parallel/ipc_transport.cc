#include "worker/parallel/ipc_transport.h"

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/parallel/cuda_status.h"

namespace flotilla::parallel {

namespace kc = kernels::cuda;

absl::StatusOr<std::unique_ptr<IpcTransport>> IpcTransport::Create(comm::Communicator& host,
                                                                   const ExchangeBuffers& buffers) {
  const int world = host.size(), rank = host.rank();
  cudaIpcMemHandle_t mine;
  FLOTILLA_CUDA_RETURN_IF_ERROR(cudaIpcGetMemHandle(&mine, buffers.recv_base()));
  std::vector<cudaIpcMemHandle_t> handles(static_cast<size_t>(world));
  FLOTILLA_RETURN_IF_ERROR(host.AllGather(&mine, handles.data(), sizeof(mine)));

  std::unique_ptr<IpcTransport> t(new IpcTransport());
  t->mapped_.assign(static_cast<size_t>(world), nullptr);
  std::vector<kc::EpRecvBuffers> peers(static_cast<size_t>(world));
  for (int p = 0; p < world; ++p) {
    if (p == rank) {
      peers[p] = buffers.recv();
      continue;
    }
    void* base = nullptr;
    const cudaError_t err = cudaIpcOpenMemHandle(&base, handles[p], cudaIpcMemLazyEnablePeerAccess);
    if (err != cudaSuccess) {
      return absl::UnavailableError(
          absl::StrCat("cuda-ipc: cannot map rank ", p, "'s buffers: ", cudaGetErrorString(err)));
    }
    t->mapped_[p] = base;
    peers[p] = buffers.layout().At(base);
  }
  FLOTILLA_CUDA_RETURN_IF_ERROR(cudaMalloc(&t->peers_, sizeof(kc::EpRecvBuffers) * world));
  FLOTILLA_CUDA_RETURN_IF_ERROR(cudaMemcpy(
      t->peers_, peers.data(), sizeof(kc::EpRecvBuffers) * world, cudaMemcpyHostToDevice));
  // The copy may return before it landed (pageable source); kernels on
  // non-blocking streams would not wait for it.
  FLOTILLA_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  return t;
}

IpcTransport::~IpcTransport() {
  for (void* base : mapped_) {
    if (base != nullptr) cudaIpcCloseMemHandle(base);
  }
  if (peers_ != nullptr) cudaFree(peers_);
}

kc::EpLaunch IpcTransport::WithPeers(kc::EpLaunch launch) const {
  launch.ipc = true;
  launch.peers = peers_;
  return launch;
}

absl::Status IpcTransport::Dispatch(kc::EpLaunch launch, const uint16_t* x, const int32_t* topk_ids,
                                    const float* topk_w, int tokens, const int32_t* expert_first,
                                    const int32_t* expert_reps, cudaStream_t stream) {
  return CudaStatus(kc::LaunchEpDispatch(WithPeers(launch), x, topk_ids, topk_w, tokens,
                                         expert_first, expert_reps, stream),
                    "dispatch");
}

absl::Status IpcTransport::Combine(kc::EpLaunch launch, float* y, int tokens, cudaStream_t stream) {
  return CudaStatus(kc::LaunchEpCombine(WithPeers(launch), y, tokens, stream), "combine");
}

absl::Status IpcTransport::AllReduce(kc::EpLaunch launch, float* data, int64_t count,
                                     cudaStream_t stream) {
  return CudaStatus(kc::LaunchEpAllReduce(WithPeers(launch), data, count, stream), "all-reduce");
}

}  // namespace flotilla::parallel
