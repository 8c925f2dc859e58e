// A ParallelContext on device memory (Memory::kDevice) for GPU ranks.
// Transports, chosen per instance at creation:
//   cuda-ipc: ranks of one node (also several processes on one GPU, which is
//     how a one-GPU machine tests it; run the MPS daemon for speed). Every
//     rank maps its peers' receive buffers (cudaIpcOpenMemHandle); kernels
//     write rows straight into them and raise per-peer sequence flags the
//     receiver polls with a bounded spin (a timeout is recorded on the device
//     and reported by CheckHealth()).
//   nccl: ranks on distinct GPUs of any number of nodes; fixed-capacity
//     ncclSend/ncclRecv per peer (counts travel inside the buffers).
// Needs CUDA; declared here without CUDA types.
//
// Use (all on the caller's stream; nothing synchronises with the host, so a
// step captures in one CUDA graph):
//   ep().SetStepTokens(n)     host only: n = the most tokens any rank runs this
//                             step; fixes cap = ceil(n / tp) * top_k rows per
//                             (source, destination) pair and so every launch's
//                             shape and ExpertRows::rows = world * cap. Graphs
//                             captured after the same n replay the same shapes.
//                             n outside [0, max_tokens_per_step] makes the next
//                             Dispatch return INVALID_ARGUMENT.
//   ep().Dispatch(layer, x, topk_ids, topk_w, tokens, stream)
//                             x bf16 [tokens, hidden], topk_ids int32 and
//                             topk_w f32 [tokens, top_k], all device memory,
//                             x 16-byte aligned; read by the kernels only (they
//                             may change after the stream passed Dispatch).
//                             Returns device ExpertRows whose pointers never
//                             change for the context's life: x bf16, slot
//                             (-1 padding), ones (1 real, 0 padding), out f32,
//                             zero on every row when Dispatch's kernel has run.
//                             Experts must write real rows only (LaunchMoeLayer
//                             skips slots outside [0, experts)). The rows are
//                             valid until the matching Combine.
//   ep().Combine(layer, y, stream)
//                             y f32 [tokens, hidden] (16-byte aligned) of every
//                             token of the TP group, overwritten.
//   tp().AllReduce(data, count, stream)
//                             cuda-ipc: one-shot, summed in TP-rank order (the
//                             same bits on every rank and as the host context);
//                             nccl: ncclAllReduce (the same bits on every rank,
//                             NCCL's order).
//   CheckHealth()             after the caller synchronised the stream.
//   WaitForStream(stream)     instead of cudaStreamSynchronize: polls the
//                             stream, the interrupt and the transport's
//                             health; gives up on either (then destroy the
//                             graphs, Abort(), and the stream drains).
// SetExpertMap waits for the whole device and rewrites the device table in
// place (captured graphs stay valid).
//
// Memory per rank: about world * cap_max * hidden * 10 bytes (bf16 rows in,
// f32 outputs twice) with cap_max = ceil(max_tokens_per_step / tp) * top_k,
// plus, with cuda-ipc and TP > 1, 4 * tp MB of all-reduce staging and
// max_tokens_per_step * hidden * 4 bytes for joining the TP shares.
#pragma once

#include <atomic>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "comm/communicator.h"
#include "worker/parallel/parallel_context.h"

namespace flotilla::parallel {

enum class DeviceTransport { kAuto, kCudaIpc, kNccl };

struct DeviceContextOptions {
  int device = 0;  // CUDA device of this rank
  DeviceTransport transport =
      DeviceTransport::kAuto;  // kAuto: cuda-ipc when all ranks share a node
  int hidden = 0;              // a multiple of 8
  int top_k = 0;               // 1 to 8
  int64_t max_tokens_per_step = 0;
  absl::Duration timeout = absl::Seconds(30);  // bound of every device wait
  // cuda-ipc: combines of at most kEpLlMaxCap rows per segment return their
  // outputs (and trade the TP group's finished rows) as flagged lines (no
  // fence, no flag round trip). Off only to compare (flotilla_ep_bench
  // --no-lines); every rank must agree.
  bool flagged_lines = true;
  // Raised (by another thread) when the instance is being torn down: ends
  // WaitForStream and the transport's waits early. May be null.
  std::shared_ptr<const std::atomic<bool>> interrupt;
};

// `host` spans the same ranks as the instance (rank() == rank) and is used
// only while creating the context: to learn which ranks share a node and to
// exchange IPC handles or the NCCL unique id. It need not outlive the call.
// Every rank must call it; a rank that fails makes the others fail too (or,
// if it fails before the first exchange, time out in `host`).
absl::StatusOr<std::unique_ptr<ParallelContext>> CreateDeviceContext(
    const ParallelConfig& config, ExpertMap map, int rank, comm::Communicator& host,
    const DeviceContextOptions& options);

}  // namespace flotilla::parallel
