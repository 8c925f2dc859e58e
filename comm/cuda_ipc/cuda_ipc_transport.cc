#include "comm/cuda_ipc/cuda_ipc_transport.h"

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/status.h"

namespace flotilla::comm {
namespace {

namespace kc = kernels::cuda;

// `pointer` inside the allocation at `from`, at the same offset inside `to`.
template <typename T>
T* Moved(T* pointer, const void* from, void* to) {
  const ptrdiff_t offset = reinterpret_cast<const char*>(pointer) - static_cast<const char*>(from);
  return reinterpret_cast<T*>(static_cast<char*>(to) + offset);
}

// A peer's receive buffers as mapped at `base`: this rank's view moved there.
kc::EpRecvBuffers ViewAt(const kc::EpRecvBuffers& mine, const void* my_base, void* base) {
  kc::EpRecvBuffers view;
  view.x = Moved(mine.x, my_base, base);
  view.meta = Moved(mine.meta, my_base, base);
  view.combined = Moved(mine.combined, my_base, base);
  view.gathered = Moved(mine.gathered, my_base, base);
  view.reduce = Moved(mine.reduce, my_base, base);
  view.flags = Moved(mine.flags, my_base, base);
  view.ll = Moved(mine.ll, my_base, base);
  view.ll_count = mine.ll_count;
  view.combined_ll = mine.combined_ll == nullptr ? nullptr : Moved(mine.combined_ll, my_base, base);
  view.gathered_ll = mine.gathered_ll == nullptr ? nullptr : Moved(mine.gathered_ll, my_base, base);
  view.ll_cap = mine.ll_cap;
  view.gathered_ll_tokens = mine.gathered_ll_tokens;
  return view;
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaIpcTransport>> CudaIpcTransport::Create(
    Communicator& host, void* recv_base, const kc::EpRecvBuffers& recv) {
  const int world = host.size(), rank = host.rank();
  cudaIpcMemHandle_t mine;
  FLOTILLA_CUDA_RETURN_IF_ERROR(cudaIpcGetMemHandle(&mine, recv_base));
  std::vector<cudaIpcMemHandle_t> handles(static_cast<size_t>(world));
  FLOTILLA_RETURN_IF_ERROR(host.AllGather(&mine, handles.data(), sizeof(mine)));

  std::unique_ptr<CudaIpcTransport> t(new CudaIpcTransport());
  t->mapped_.assign(static_cast<size_t>(world), nullptr);
  std::vector<kc::EpRecvBuffers> peers(static_cast<size_t>(world));
  for (int p = 0; p < world; ++p) {
    if (p == rank) {
      peers[p] = recv;
      continue;
    }
    void* base = nullptr;
    const cudaError_t err = cudaIpcOpenMemHandle(&base, handles[p], cudaIpcMemLazyEnablePeerAccess);
    if (err != cudaSuccess) {
      return absl::UnavailableError(
          absl::StrCat("cuda-ipc: cannot map rank ", p, "'s buffers: ", cudaGetErrorString(err)));
    }
    t->mapped_[p] = base;
    peers[p] = ViewAt(recv, recv_base, base);
  }
  FLOTILLA_CUDA_RETURN_IF_ERROR(cudaMalloc(&t->peers_, sizeof(kc::EpRecvBuffers) * world));
  FLOTILLA_CUDA_RETURN_IF_ERROR(cudaMemcpy(
      t->peers_, peers.data(), sizeof(kc::EpRecvBuffers) * world, cudaMemcpyHostToDevice));
  // The copy may return before it landed (pageable source); kernels on
  // non-blocking streams would not wait for it.
  FLOTILLA_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  return t;
}

CudaIpcTransport::~CudaIpcTransport() {
  for (void* base : mapped_) {
    if (base != nullptr) cudaIpcCloseMemHandle(base);
  }
  if (peers_ != nullptr) cudaFree(peers_);
}

kc::EpLaunch CudaIpcTransport::WithPeers(kc::EpLaunch launch) const {
  launch.ipc = true;
  launch.peers = peers_;
  return launch;
}

absl::Status CudaIpcTransport::Dispatch(kc::EpLaunch launch, const uint16_t* x,
                                        const int32_t* topk_ids, const float* topk_w, int tokens,
                                        const int32_t* expert_first, const int32_t* expert_reps,
                                        cudaStream_t stream) {
  return CudaStatus(kc::LaunchEpDispatch(WithPeers(launch), x, topk_ids, topk_w, tokens,
                                         expert_first, expert_reps, stream),
                    "dispatch");
}

absl::Status CudaIpcTransport::Combine(kc::EpLaunch launch, float* y, int tokens,
                                       cudaStream_t stream) {
  return CudaStatus(kc::LaunchEpCombine(WithPeers(launch), y, tokens, stream), "combine");
}

absl::Status CudaIpcTransport::AllReduce(kc::EpLaunch launch, float* data, int64_t count,
                                         cudaStream_t stream, float* residual) {
  return CudaStatus(kc::LaunchEpAllReduce(WithPeers(launch), data, count, stream, residual),
                    "all-reduce");
}

bool CudaIpcTransport::DeviceLines(kc::EpLaunch* launch) const {
  *launch = WithPeers(*launch);
  return launch->self.ll != nullptr && launch->self.ll_count > 0;
}

}  // namespace flotilla::comm
