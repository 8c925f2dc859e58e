#include "comm/nccl/nccl_transport.h"

#include <nccl.h>

#include <vector>

#include "common/cuda_status.h"
#include "common/status.h"

namespace flotilla::comm {

namespace kc = kernels::cuda;

absl::StatusOr<std::unique_ptr<NcclTransport>> NcclTransport::Create(
    Communicator& host, const ParallelConfig& config, const NcclStagingSizes& sizes,
    absl::Duration timeout, std::shared_ptr<const std::atomic<bool>> interrupt) {
  std::unique_ptr<NcclTransport> t(new NcclTransport());
  const size_t rows = static_cast<size_t>(sizes.world * sizes.cap_max);
  const size_t x_bytes = (rows * sizes.hidden * sizeof(uint16_t) + 255) / 256 * 256;
  const size_t meta_bytes = static_cast<size_t>(sizes.world) * (sizes.cap_max + 1) * 4;
  FLOTILLA_CUDA_RETURN_IF_ERROR(cudaMalloc(&t->staging_, x_bytes + meta_bytes));
  t->staging_view_.x = static_cast<uint16_t*>(t->staging_);
  t->staging_view_.meta = reinterpret_cast<int32_t*>(static_cast<char*>(t->staging_) + x_bytes);
  std::vector<kc::EpRecvBuffers> pack_to(static_cast<size_t>(sizes.world), t->staging_view_);
  FLOTILLA_CUDA_RETURN_IF_ERROR(cudaMalloc(&t->pack_to_, sizeof(kc::EpRecvBuffers) * sizes.world));
  FLOTILLA_CUDA_RETURN_IF_ERROR(cudaMemcpy(t->pack_to_, pack_to.data(),
                                           sizeof(kc::EpRecvBuffers) * sizes.world,
                                           cudaMemcpyHostToDevice));
  FLOTILLA_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());  // the copy may still be in flight
  std::optional<NcclSplit> split;
  if (config.tp_size() > 1) {
    const int rank = host.rank();
    split = NcclSplit{config.dp_group_of(rank), config.tp_rank_of(rank),
                      "tensor-parallel communicator"};
  }
  FLOTILLA_ASSIGN_OR_RETURN(t->comms_,
                            NcclComms::Create(host, split, timeout, std::move(interrupt)));
  return t;
}

NcclTransport::~NcclTransport() {
  comms_.reset();  // finalized (or aborted) before the buffers their work used go
  if (pack_to_ != nullptr) cudaFree(pack_to_);
  if (staging_ != nullptr) cudaFree(staging_);
}

absl::Status NcclTransport::Dispatch(kc::EpLaunch launch, const uint16_t* x,
                                     const int32_t* topk_ids, const float* topk_w, int tokens,
                                     const int32_t* expert_first, const int32_t* expert_reps,
                                     cudaStream_t stream) {
  FLOTILLA_RETURN_IF_ERROR(comms_->broken());
  launch.ipc = false;
  launch.peers = pack_to_;
  FLOTILLA_RETURN_IF_ERROR(CudaStatus(
      kc::LaunchEpDispatch(launch, x, topk_ids, topk_w, tokens, expert_first, expert_reps, stream),
      "dispatch pack"));
  const size_t cap = static_cast<size_t>(launch.shape.cap);
  const size_t row_bytes = static_cast<size_t>(launch.shape.hidden) * sizeof(uint16_t);
  char* send_x = reinterpret_cast<char*>(staging_view_.x);
  char* recv_x = reinterpret_cast<char*>(launch.self.x);
  ncclComm_t world = comms_->world();
  FLOTILLA_RETURN_IF_ERROR(comms_->Group(
      [&] {
        for (int p = 0; p < launch.shape.world; ++p) {
          if (cap > 0) {
            ncclSend(send_x + p * cap * row_bytes, cap * row_bytes, ncclUint8, p, world, stream);
            ncclRecv(recv_x + p * cap * row_bytes, cap * row_bytes, ncclUint8, p, world, stream);
          }
          ncclSend(staging_view_.meta + p * (cap + 1), cap + 1, ncclInt32, p, world, stream);
          ncclRecv(launch.self.meta + p * (cap + 1), cap + 1, ncclInt32, p, world, stream);
        }
      },
      "dispatch"));
  return CudaStatus(kc::LaunchEpUnpack(launch, stream), "dispatch unpack");
}

absl::Status NcclTransport::Combine(kc::EpLaunch launch, float* y, int tokens,
                                    cudaStream_t stream) {
  FLOTILLA_RETURN_IF_ERROR(comms_->broken());
  launch.ipc = false;
  launch.peers = pack_to_;
  const size_t rows = static_cast<size_t>(launch.shape.cap);
  const size_t floats = rows * static_cast<size_t>(launch.shape.hidden);
  if (floats > 0) {
    ncclComm_t world = comms_->world();
    FLOTILLA_RETURN_IF_ERROR(comms_->Group(
        [&] {
          for (int p = 0; p < launch.shape.world; ++p) {
            ncclSend(launch.state.out + p * floats, floats, ncclFloat32, p, world, stream);
            ncclRecv(launch.self.combined + p * floats, floats, ncclFloat32, p, world, stream);
          }
        },
        "combine"));
  }
  FLOTILLA_RETURN_IF_ERROR(
      CudaStatus(kc::LaunchEpCombine(launch, y, tokens, stream), "combine reduce"));
  ncclComm_t tp = comms_->child();
  if (tp == nullptr || tokens == 0) return absl::OkStatus();
  return comms_->Settle(tp,
                        ncclAllReduce(y, y, static_cast<size_t>(tokens) * launch.shape.hidden,
                                      ncclFloat32, ncclSum, tp, stream),
                        "combine join");
}

absl::Status NcclTransport::AllReduce(kc::EpLaunch launch, float* data, int64_t count,
                                      cudaStream_t stream, float* residual) {
  FLOTILLA_RETURN_IF_ERROR(comms_->broken());
  ncclComm_t tp = comms_->child();
  if (tp == nullptr || count == 0) return absl::OkStatus();
  FLOTILLA_RETURN_IF_ERROR(comms_->Settle(
      tp, ncclAllReduce(data, data, static_cast<size_t>(count), ncclFloat32, ncclSum, tp, stream),
      "all-reduce"));
  if (residual == nullptr) return absl::OkStatus();
  return CudaStatus(kc::LaunchEpAddAndZero(residual, data, count, stream), "all-reduce add");
}

}  // namespace flotilla::comm
