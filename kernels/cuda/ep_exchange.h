// CUDA: the expert-parallel exchange of a MoE layer and the tensor-parallel
// all-reduce between the GPU ranks of one model instance (the kernels behind
// worker/parallel's device context). Pure CUDA runtime: no Abseil, gRPC,
// protobuf or NCCL.
//
// Every rank owns one set of receive buffers (EpRecvBuffers). Its peers
// either write into them directly (cuda-ipc: the buffers are mapped into
// every peer, and per-(source, block) flags carry sequence numbers) or the
// rank packs into send staging of the same layout that NCCL then moves
// (pack mode: no flags). Shapes are fixed by `cap`, the rows a source may
// send to one destination in a step, so every launch has a host-known grid
// and the whole exchange can be captured in a CUDA graph: counts, routes and
// sequence numbers stay on the device.
//
// Layouts (W ranks, H hidden, cap rows per source segment this step):
//   x         [W * cap, H] bf16   rows of source p at p * cap + position
//   meta      [W * (cap + 1)]     source p: its row count, then each row's slot
//   combined  [W * cap, H] f32    outputs of expert rank d at d * cap + position
//   gathered  [tokens, H] f32     TP peers' finished token rows (cuda-ipc, TP > 1)
//   reduce    [2, tp, kEpMaxBlocks, kEpReduceChunk] f32  all-reduce parts
//   ll        [2, tp, ll_count / 2] 16-byte lines of the small all-reduce:
//             two f32 values, each followed by the sequence number
//             (kEpLlMaxCount bounds ll_count)
//   combined_ll [W * ll_cap, H / 2] `combined` as flagged lines of two f32
//             values, for combines of at most ll_cap rows per segment
//             (cuda-ipc): each line is waited on where it is read, so these
//             combines skip the fence and the flag round trip
//   gathered_ll [gathered_ll_tokens, H / 2] `gathered` as lines of two f32
//             values, for the TP gather of those small combines
//   flags     EpFlagWords(W, tp) sequence words (cuda-ipc only)
//
// A pair (token t, choice j) of this rank's share becomes one row: its
// expert's replica (EpReplicaIndex) names the destination rank and slot; its
// position in the destination's segment is its rank among the share's pairs
// to that destination in (t, j) order, so placement is deterministic.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "common/host_device.h"

namespace flotilla::kernels::cuda {

// Most blocks of one launch. Grids are a function of the step's capacity
// (exchanges) or the element count (all-reduce), both known on the host, so
// graphs replay the same shapes; each block signals each peer once per
// operation (or all-reduce round) and every block waits for all of them.
inline constexpr int kEpMaxBlocks = 64;
// f32 elements an all-reduce block moves per round and peer.
inline constexpr int kEpReduceChunk = 8192;
// Most f32 elements an all-reduce sends as flagged lines (64 tokens of
// H = 2880 and some): each 8-byte half of a 16-byte line carries a value and
// the sequence number, so a receiver waits on the data itself and no fence
// or flag round trip is needed. Larger all-reduces use `reduce` and flags.
inline constexpr int64_t kEpLlMaxCount = 262144;
// Most rows per source segment a combine returns as flagged lines (8 tokens
// per rank at top-4): smaller combines skip the fence and the flag round
// trip; larger ones write `combined` and raise flags (on two H200s lines
// were faster up to 32 rows and slower at 64). Dispatches always use the
// flags: rows sent as lines must be copied out of them before the experts
// read them, which cost more than the fence it saves (two H200s, 1-16
// tokens per rank).
inline constexpr int kEpLlMaxCap = 32;
// Largest world the kernels take (the plan keeps per-destination counters in
// shared memory).
inline constexpr int kEpMaxRanks = 256;

// Blocks of the dispatch and combine kernels for `cap` rows per segment (a
// rank sends and receives about cap rows): one block per two rows, so a
// copy takes a round or two of loads, within [2, max_blocks].
inline FLOTILLA_HOST_DEVICE int EpExchangeBlocks(int cap, int max_blocks) {
  const int blocks = (cap + 1) / 2;
  return blocks < 2 ? 2 : (blocks > max_blocks ? max_blocks : blocks);
}

// Blocks of the all-reduce of `count` elements: about 2048 per block, within
// [1, max_blocks].
inline FLOTILLA_HOST_DEVICE int EpReduceBlocks(int64_t count, int max_blocks) {
  const int64_t blocks = (count + 2047) / 2048;
  return blocks < 1 ? 1 : (blocks > max_blocks ? max_blocks : static_cast<int>(blocks));
}

// Blocks of these kernels that fit on `device` at once (0 when unknown).
// Every block of a launch waits for every peer's, so the blocks of all ranks
// sharing a GPU must be resident together: a context caps its grids at this
// over twice the ranks on the GPU.
int EpResidentBlocks(int device);

// Which of an expert's `replicas` copies pair (token, choice) goes to: takes
// turns, so a hot expert's rows spread over its copies; deterministic, and
// the rule the host context uses too.
inline FLOTILLA_HOST_DEVICE int EpReplicaIndex(int token, int choice, int replicas) {
  return (token + choice) % replicas;
}

// A packed (rank, slot) entry of the device expert table.
inline FLOTILLA_HOST_DEVICE int32_t EpPackLocation(int rank, int slot) {
  return (rank << 16) | slot;
}

// Tokens of `tokens` that TP rank `tp_rank` of `tp_size` dispatches
// (t % tp_size == tp_rank).
inline FLOTILLA_HOST_DEVICE int EpShareTokens(int tokens, int tp_size, int tp_rank) {
  return tokens > tp_rank ? (tokens - tp_rank + tp_size - 1) / tp_size : 0;
}

// One rank's receive side; what peers (cuda-ipc) or NCCL write into.
struct EpRecvBuffers {
  uint16_t* x = nullptr;
  int32_t* meta = nullptr;
  float* combined = nullptr;
  float* gathered = nullptr;
  float* reduce = nullptr;
  uint64_t* flags = nullptr;
  uint32_t* ll = nullptr;           // 16-byte lines (see the layouts above)
  int64_t ll_count = 0;             // f32 elements of one flagged-line all-reduce
  // The small combines' lines (see the layouts above).
  uint32_t* combined_ll = nullptr;
  uint32_t* gathered_ll = nullptr;
  int ll_cap = 0;              // rows per segment combined_ll holds (0: none)
  int gathered_ll_tokens = 0;  // tokens gathered_ll holds (0: none)
};

// Offsets of the flag groups inside EpRecvBuffers::flags, indexed
// [source][block]: dispatch and combine by world rank, gather and reduce by
// TP rank.
struct EpFlagLayout {
  int world = 0;
  int tp = 0;
  FLOTILLA_HOST_DEVICE size_t dispatch() const { return 0; }
  FLOTILLA_HOST_DEVICE size_t combine() const { return static_cast<size_t>(world) * kEpMaxBlocks; }
  FLOTILLA_HOST_DEVICE size_t gather() const {
    return 2 * static_cast<size_t>(world) * kEpMaxBlocks;
  }
  FLOTILLA_HOST_DEVICE size_t reduce() const {
    return gather() + static_cast<size_t>(tp) * kEpMaxBlocks;
  }
  FLOTILLA_HOST_DEVICE size_t words() const {
    return reduce() + static_cast<size_t>(tp) * kEpMaxBlocks;
  }
};

// This rank's sequence numbers: dispatch, combine, then one per all-reduce
// block. Dispatch and combine alternate, so each advances the other's number
// when it starts (no block of it reads that one). An all-reduce block only
// trades with the same block of its peers, so each block index counts its
// own rounds (the grids, a function of the count, are the same on every
// rank). Graph replays keep counting either way. The flagged-line
// all-reduce has one number for the whole launch and a counter of its
// finished blocks: the last block to finish advances the number.
inline constexpr int kEpLlEpochWord = 2 + kEpMaxBlocks;
inline constexpr int kEpLlDoneWord = kEpLlEpochWord + 1;
inline constexpr int kEpEpochWords = kEpLlDoneWord + 1;

// What a device wait that ran past its bound leaves in the error word:
// kEpErrorBase + op * 65536 + the rank waited for.
enum EpOp : int { kEpOpDispatch = 1, kEpOpCombine = 2, kEpOpGather = 3, kEpOpReduce = 4 };
inline constexpr int kEpErrorBase = 1;

// This rank's working state on the device (not visible to peers).
struct EpState {
  int32_t* slot = nullptr;        // [W * cap_max] ExpertRows::slot
  float* ones = nullptr;          // [W * cap_max] ExpertRows::ones
  float* out = nullptr;           // [W * cap_max, H] ExpertRows::out
  int32_t* recv_count = nullptr;  // [W] rows received from each source
  int32_t* route =
      nullptr;  // [pairs_max] where pair n's output comes back (d * cap + pos, -1: none)
  int32_t* order = nullptr;    // [pairs_max] per share token, its pairs in ascending expert id
  float* order_w = nullptr;    // [pairs_max] their router weights
  uint32_t* epochs = nullptr;  // [kEpEpochWords]
  int32_t* error = nullptr;    // 0, or what broke (see EpOp)
};

struct EpShape {
  int world = 1;
  int rank = 0;
  int tp_size = 1;
  int tp_rank = 0;
  int hidden = 0;  // a multiple of 8
  int top_k = 0;   // 1 to 8
  int num_experts = 0;
  int cap = 0;                    // rows per source segment this step
  int max_blocks = kEpMaxBlocks;  // grid cap, the same on every rank
};

// Arguments of every launcher. `peers` is a device array of W entries: in
// cuda-ipc mode rank d's receive buffers as mapped on this rank (this rank's
// own at index rank); in pack mode every entry is this rank's send staging.
struct EpLaunch {
  EpShape shape;
  bool ipc = true;
  const EpRecvBuffers* peers = nullptr;
  EpRecvBuffers self;  // this rank's receive buffers
  EpState state;
  uint64_t timeout_ns = 0;  // bound of each device wait
};

// Dispatch of `tokens` rows of x (bf16 [tokens, H]) with topk_ids/topk_w
// ([tokens, top_k]); expert_first [E + 1] and expert_reps (packed
// locations) are the layer's table. cuda-ipc: writes into the peers, raises
// the dispatch flags, waits for every peer's, then fills slot/ones. Pack
// mode: fills the send staging only (then move it and call LaunchEpUnpack).
// `out` is all zero whenever a dispatch runs: it starts zeroed and every
// combine zeroes the rows it returned (kernels must not write padding rows).
cudaError_t LaunchEpDispatch(const EpLaunch& l, const uint16_t* x, const int32_t* topk_ids,
                             const float* topk_w, int tokens, const int32_t* expert_first,
                             const int32_t* expert_reps, cudaStream_t stream);

// Pack mode, after the staging arrived in self.x / self.meta: slot, ones and
// recv_count.
cudaError_t LaunchEpUnpack(const EpLaunch& l, cudaStream_t stream);

// cuda-ipc: returns every output row to its source's `combined`, waits for
// this rank's, writes y [tokens, H] for the share, and with TP > 1 trades
// finished rows with the TP peers so y holds every token of the group.
// Pack mode: reads `combined` (already moved) and writes y for the share and
// zeros for the other tokens (a TP all-reduce then joins the shares). Both
// zero the out rows they returned.
cudaError_t LaunchEpCombine(const EpLaunch& l, float* y, int tokens, cudaStream_t stream);

// cuda-ipc, TP > 1: sums `count` f32 of `data` over the TP group in TP-rank
// order (every rank gets the same bits). Without `residual` the sum replaces
// `data`; with it, residual[i] += sum[i] and `data` is left all zero (the
// next producer may add into it). Up to self.ll_count elements (even counts)
// go as flagged lines in one kernel; more go in rounds through `reduce`.
cudaError_t LaunchEpAllReduce(const EpLaunch& l, float* data, int64_t count, cudaStream_t stream,
                              float* residual = nullptr);

// residual[i] += part[i], then part[i] = 0 (what the all-reduce with a
// residual does after a transport that only sums, e.g. NCCL).
cudaError_t LaunchEpAddAndZero(float* residual, float* part, int64_t count, cudaStream_t stream);

}  // namespace flotilla::kernels::cuda
