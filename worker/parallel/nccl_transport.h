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
// Communicators are non-blocking so that forming the group and every enqueue
// have a deadline (cut short by `interrupt`). A dead peer leaves NCCL's
// kernels waiting for good (over its socket transport the proxy sees the
// connection close, the kernels do not): Health() reports NCCL's
// asynchronous errors, and Abort() (ncclCommAbort) makes the kernels exit.
#pragma once

#include <atomic>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "comm/communicator.h"
#include "common/parallel_config.h"
#include "worker/parallel/exchange_buffers.h"
#include "worker/parallel/exchange_transport.h"

typedef struct ncclComm* ncclComm_t;

namespace flotilla::parallel {

class NcclTransport final : public ExchangeTransport {
 public:
  // Rank 0 makes the unique id and broadcasts it over `host`; the TP groups
  // are split off the world communicator. `interrupt` (may be null), once
  // true, ends every wait for a non-blocking call at once.
  static absl::StatusOr<std::unique_ptr<NcclTransport>> Create(
      comm::Communicator& host, const ParallelConfig& config, const ExchangeSizes& sizes,
      absl::Duration timeout, std::shared_ptr<const std::atomic<bool>> interrupt = nullptr);
  ~NcclTransport() override;

  std::string name() const override { return "nccl"; }
  absl::Status Dispatch(kernels::cuda::EpLaunch launch, const uint16_t* x, const int32_t* topk_ids,
                        const float* topk_w, int tokens, const int32_t* expert_first,
                        const int32_t* expert_reps, cudaStream_t stream) override;
  absl::Status Combine(kernels::cuda::EpLaunch launch, float* y, int tokens,
                       cudaStream_t stream) override;
  absl::Status AllReduce(kernels::cuda::EpLaunch launch, float* data, int64_t count,
                         cudaStream_t stream) override;
  absl::Status Health() override;
  void Abort() override;

 private:
  NcclTransport(const ExchangeSizes& sizes, absl::Duration timeout,
                std::shared_ptr<const std::atomic<bool>> interrupt)
      : sizes_(sizes), timeout_(timeout), interrupt_(std::move(interrupt)) {}
  absl::Status Form(comm::Communicator& host, const ParallelConfig& config);
  // Waits out ncclInProgress of a non-blocking call on `comm`.
  absl::Status Settle(ncclComm_t comm, int result, const char* what);

  ExchangeSizes sizes_;
  absl::Duration timeout_;
  std::shared_ptr<const std::atomic<bool>> interrupt_;
  ncclComm_t world_ = nullptr;
  ncclComm_t tp_ = nullptr;
  void* staging_ = nullptr;                          // send rows and metas
  kernels::cuda::EpRecvBuffers* pack_to_ = nullptr;  // device array: W x the staging
  kernels::cuda::EpRecvBuffers staging_view_;
  absl::Status broken_;
};

}  // namespace flotilla::parallel
