// Flagged lines, the device side of the small exchanges (ep_exchange.h): a
// 16-byte line holds two f32 values, each followed by the launch's sequence
// number, so a peer's 8-byte halves land whole and a receiver that sees both
// numbers has both values, with no fence and no separate flag. Stale lines
// carry an older number and are waited past.
//
// The TP all-reduce of up to EpRecvBuffers::ll_count values runs on them:
// LaunchEpAllReduce's own kernel, or a producing kernel's epilogue
// (LaunchLinearTpSum) that sends the lines of the values it just computed.
// Either way one launch owns one sequence number: every block reads it after
// the launch started (TpLinesEpoch) and the last block to finish advances it
// (TpLinesBlockDone), so launches of any kind and graph replays keep counting
// in step on every rank of the group.
#pragma once

#include <cstdint>

#include "kernels/cuda/ep_exchange.h"

namespace flotilla::kernels::cuda {

__device__ __forceinline__ uint64_t GlobalTimerNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ void StoreLine(uint32_t* p, uint4 v) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y),
               "r"(v.z), "r"(v.w)
               : "memory");
}

__device__ __forceinline__ uint4 LoadLine(const uint32_t* p) {
  uint4 v;
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p)
               : "memory");
  return v;
}

// A line of two 32-bit words, each followed by the sequence number.
__device__ __forceinline__ uint4 WordsLine(uint32_t a, uint32_t b, uint32_t epoch) {
  return make_uint4(a, epoch, b, epoch);
}

__device__ __forceinline__ uint4 LineOf(float2 v, uint32_t epoch) {
  return WordsLine(__float_as_uint(v.x), __float_as_uint(v.y), epoch);
}

__device__ __forceinline__ bool LineReady(uint4 w, uint32_t epoch) {
  return w.y == epoch && w.w == epoch;
}

// The two words of a line (WordsLine's inverse).
__device__ __forceinline__ uint2 WordsOf(uint4 w) { return make_uint2(w.x, w.z); }

// The two values of a line (LineOf's inverse).
__device__ __forceinline__ float2 ValuesOf(uint4 w) {
  return make_float2(__uint_as_float(w.x), __uint_as_float(w.z));
}

// Waits for a line of `epoch`; false when the bound passed (recorded as a
// wait of `op` on world rank `source`) or another wait already failed.
__device__ inline bool WaitLine(const uint32_t* p, uint32_t epoch, uint64_t deadline,
                                int32_t* error, int op, int source, float2* value) {
  for (uint32_t spins = 1;; ++spins) {
    const uint4 w = LoadLine(p);
    if (LineReady(w, epoch)) {
      *value = ValuesOf(w);
      return true;
    }
    if ((spins & 127) != 0) continue;
    if (*reinterpret_cast<volatile int32_t*>(error) != 0) return false;
    if (GlobalTimerNs() > deadline) {
      atomicCAS(error, 0, kEpErrorBase + op * 65536 + source);
      return false;
    }
  }
}

// Waits until every line at[i] (null entries skipped) carries `epoch`;
// lines[i] holds each one's first load and ends with its ready value. Only
// the lines not yet ready are loaded again, all in one round, so the wait
// ends one memory latency after the last line landed instead of one per
// line waited for in turn. False when the bound passed (recorded against
// world rank source[i] of a line still missing) or another wait failed.
template <int N>
__device__ inline bool WaitAllLines(const uint32_t* const (&at)[N], uint4 (&lines)[N],
                                    const int (&source)[N], uint32_t epoch, uint64_t deadline,
                                    int32_t* error, int op) {
  for (uint32_t spins = 1;; ++spins) {
    int missing = -1;
#pragma unroll
    for (int i = 0; i < N; ++i) {
      if (at[i] != nullptr && !LineReady(lines[i], epoch)) missing = i;
    }
    if (missing < 0) return true;
#pragma unroll
    for (int i = 0; i < N; ++i) {
      if (at[i] != nullptr && !LineReady(lines[i], epoch)) lines[i] = LoadLine(at[i]);
    }
    if ((spins & 127) != 0) continue;
    if (*reinterpret_cast<volatile int32_t*>(error) != 0) return false;
    if (GlobalTimerNs() > deadline) {
      atomicCAS(error, 0, kEpErrorBase + op * 65536 + source[missing]);
      return false;
    }
  }
}

// Sends a 16-byte payload as two lines at p and p + 4.
__device__ __forceinline__ void StorePayloadLines(uint32_t* p, uint4 v, uint32_t epoch) {
  StoreLine(p, WordsLine(v.x, v.y, epoch));
  StoreLine(p + 4, WordsLine(v.z, v.w, epoch));
}

// Line `line` of TP rank `part`'s values in half `parity` of `ll`: the
// all-reduce's lines alternate two halves by the number's parity, since a
// rank may be one round ahead of a peer still reading the other half.
__device__ __forceinline__ uint32_t* LlLine(uint32_t* ll, int64_t ll_count, int tp, int parity,
                                            int part, int64_t line) {
  return ll + (static_cast<size_t>(parity * tp + part) * (ll_count / 2) + line) * 4;
}

// The sequence number of the all-reduce this launch runs.
__device__ __forceinline__ uint32_t TpLinesEpoch(const EpLaunch& l) {
  return *reinterpret_cast<const volatile uint32_t*>(l.state.epochs + kEpLlEpochWord) + 1;
}

// Sends line `i` of this rank's values to every TP peer.
__device__ __forceinline__ void SendTpLine(const EpLaunch& l, uint32_t epoch, int64_t i, float2 v) {
  const EpShape& s = l.shape;
  const int group_first = s.rank - s.tp_rank;
  const uint4 line = LineOf(v, epoch);
  for (int peer = 0; peer < s.tp_size; ++peer) {
    if (peer == s.tp_rank) continue;
    StoreLine(LlLine(l.peers[group_first + peer].ll, l.self.ll_count, s.tp_size,
                     static_cast<int>(epoch & 1), s.tp_rank, i),
              line);
  }
}

// Line `i` summed over the TP group in TP-rank order (`mine` is this rank's
// part), once every peer's line arrived; false when a wait failed.
__device__ inline bool SumTpLine(const EpLaunch& l, uint32_t epoch, int64_t i, float2 mine,
                                 uint64_t deadline, float2* sum) {
  const EpShape& s = l.shape;
  const int group_first = s.rank - s.tp_rank;
  float2 acc = make_float2(0.f, 0.f);
  for (int part = 0; part < s.tp_size; ++part) {
    float2 v = mine;
    if (part != s.tp_rank &&
        !WaitLine(
            LlLine(l.self.ll, l.self.ll_count, s.tp_size, static_cast<int>(epoch & 1), part, i),
            epoch, deadline, l.state.error, kEpOpReduce, group_first + part, &v)) {
      return false;
    }
    acc = part == 0 ? v : make_float2(__fadd_rn(acc.x, v.x), __fadd_rn(acc.y, v.y));
  }
  *sum = acc;
  return true;
}

// Called by every block of the launch once its lines are summed (all its
// threads past their waits): the last block advances the sequence number.
__device__ __forceinline__ void TpLinesBlockDone(const EpLaunch& l, uint32_t epoch,
                                                 unsigned blocks) {
  __syncthreads();
  if (threadIdx.x != 0) return;
  __threadfence();
  if (atomicAdd(l.state.epochs + kEpLlDoneWord, 1u) == blocks - 1) {
    l.state.epochs[kEpLlDoneWord] = 0;
    l.state.epochs[kEpLlEpochWord] = epoch;
  }
}

}  // namespace flotilla::kernels::cuda
