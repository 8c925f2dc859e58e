// nccl: ranks on distinct GPUs of any nodes. Dispatch packs rows into send
// staging with the same kernels as cuda-ipc (pack mode), then one NCCL group
// moves a fixed `cap` rows (and the segment's count and slots) to every peer,
// so no count ever visits the host; Combine moves `cap` output rows back and
// joins the TP group's shares with an all-reduce of zero-filled rows (exact:
// each element has one non-zero term). tp().AllReduce is ncclAllReduce: every
// rank gets the same bits (NCCL computes each element once and forwards it),
// but not in TP-rank order, so they may differ from cuda-ipc's sums for
// TP > 2.
//
// The communicators (the world and the TP groups split off it) are
// NcclComms (nccl_comms.h): non-blocking, every wait bounded, Health() and
// Abort() for a peer that died inside NCCL's kernels.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "comm/communicator.h"
#include "comm/exchange_transport.h"
#include "comm/nccl/nccl_comms.h"
#include "common/parallel_config.h"

namespace flotilla::comm {

// What the send staging must hold: `world` segments of up to `cap_max` rows
// of `hidden` bf16 (and each segment's count and slots).
struct NcclStagingSizes {
  int world = 1;
  int hidden = 0;
  int64_t cap_max = 0;
};

class NcclTransport final : public ExchangeTransport {
 public:
  // Rank 0 makes the unique id and broadcasts it over `host`; the TP groups
  // are split off the world communicator. `interrupt` (may be null), once
  // true, ends every wait for a non-blocking call at once.
  static absl::StatusOr<std::unique_ptr<NcclTransport>> Create(
      Communicator& host, const ParallelConfig& config, const NcclStagingSizes& sizes,
      absl::Duration timeout, std::shared_ptr<const std::atomic<bool>> interrupt = nullptr);
  ~NcclTransport() override;

  std::string name() const override { return "nccl"; }
  absl::Status Dispatch(kernels::cuda::EpLaunch launch, const uint16_t* x, const int32_t* topk_ids,
                        const float* topk_w, int tokens, const int32_t* expert_first,
                        const int32_t* expert_reps, cudaStream_t stream) override;
  absl::Status Combine(kernels::cuda::EpLaunch launch, float* y, int tokens,
                       cudaStream_t stream) override;
  absl::Status AllReduce(kernels::cuda::EpLaunch launch, float* data, int64_t count,
                         cudaStream_t stream, float* residual) override;
  absl::Status Health() override { return comms_->Health(); }
  void Abort() override { comms_->Abort(); }

 private:
  NcclTransport() = default;

  std::unique_ptr<NcclComms> comms_;
  void* staging_ = nullptr;                          // send rows and metas
  kernels::cuda::EpRecvBuffers* pack_to_ = nullptr;  // device array: W x the staging
  kernels::cuda::EpRecvBuffers staging_view_;
};

}  // namespace flotilla::comm
