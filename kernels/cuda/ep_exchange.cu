// The expert-parallel exchange kernels (see ep_exchange.h for the layouts).
//
// Synchronisation (cuda-ipc): a block that wrote into peers meets at a
// barrier, then one thread fences at system scope (cumulative over what the
// block wrote, which the barrier ordered before it) and stores the sequence
// number into each peer's flag with release semantics; a receiver loads
// flags with acquire semantics and reads peer-written data through L2
// (ld.global.cg), never from a possibly stale L1 line. Every block of a
// launch reads the operation's sequence number when it starts; dispatch and
// combine advance each other's (they alternate), each all-reduce block its
// own, so launches of any grid (and graph replays) keep counting. Waits are
// bounded by %globaltimer: past the bound the block records an error word,
// and every later kernel returns at once when it finds it set. All-reduces
// of up to ll_count elements, and combines (with their TP gather) of up to
// ll_cap rows per segment, send flagged lines instead (value and sequence
// number in each 8-byte half), so they need neither the fence nor the flag.
//
// Buffer reuse: a source writes its layer L+1 rows into a destination only
// after its own layer L combine finished, which needed the destination's
// layer L outputs, which the destination sends after its experts read the
// layer L rows; combine and gather buffers are protected the same way. The
// all-reduce alternates two halves (by sequence parity): a rank can only be
// one round ahead of a peer that still reads the other half.
//
// Copies keep several 16-byte loads in flight per thread (kUnroll): one at a
// time, a copy loop is bound by memory latency, not bandwidth.
#include <algorithm>
#include <climits>

#include "kernels/cuda/ep_exchange.h"
#include "kernels/cuda/ep_lines.cuh"

namespace flotilla::kernels::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxTopK = 8;  // the combine keeps one output vector per expert in registers
constexpr int kUnroll = 4;
// EpState::epochs: dispatch, combine, then the all-reduce's per block.
constexpr int kDispatchEpoch = 0;
constexpr int kCombineEpoch = 1;
constexpr int kReduceEpoch = 2;

__device__ __forceinline__ uint64_t LoadAcquire(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

// A flag store after a system-scope fence (the fence makes it a release).
__device__ __forceinline__ void StoreRelaxed(uint64_t* p, uint64_t v) {
  asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

// The error word read once per block and shared, so that every thread of
// the block takes the same branch.
__device__ bool BlockBroken(const int32_t* error) {
  __shared__ int broken;
  if (threadIdx.x == 0) broken = *reinterpret_cast<const volatile int32_t*>(error);
  __syncthreads();
  const bool result = broken != 0;
  __syncthreads();
  return result;
}

// The operation's sequence number as this launch started.
__device__ __forceinline__ uint64_t LaunchEpoch(const EpState& state, int op) {
  return *reinterpret_cast<const volatile uint32_t*>(state.epochs + op);
}

// Advances the sequence number of the operation that follows this one
// (dispatch -> combine -> dispatch): nothing of this launch reads it, and the
// next launch starts after this one ended.
__device__ __forceinline__ void AdvanceNext(const EpState& state, int next) {
  if (blockIdx.x == 0 && threadIdx.x == 0) state.epochs[next] += 1;
}

// Whether this step's combine sends its outputs as flagged lines: every
// segment fits the lines (the cap is the same on every rank of a step).
__host__ __device__ __forceinline__ bool CombineAsLines(const EpLaunch& l) {
  return l.ipc && l.self.combined_ll != nullptr && l.shape.cap <= l.self.ll_cap;
}

// Whether a combine of `tokens` (the TP group's) trades its finished rows
// with the TP peers as lines.
__host__ __device__ __forceinline__ bool GatherAsLines(const EpLaunch& l, int tokens) {
  return CombineAsLines(l) && l.self.gathered_ll != nullptr && tokens <= l.self.gathered_ll_tokens;
}

// Waits until flags[source * kEpMaxBlocks + b] >= target for every source in
// [0, sources) except `skip` and every b < blocks. Each thread polls its
// share of the words. Returns false when the bound passed (the error word
// then names op and the world rank first_rank + source) or another block
// already failed.
__device__ bool WaitFlags(const uint64_t* flags, int sources, int blocks, int skip, uint64_t target,
                          uint64_t deadline, int32_t* error, int op, int first_rank) {
  __shared__ int failed;
  if (threadIdx.x == 0) failed = 0;
  __syncthreads();
  volatile int* vfailed = &failed;
  for (int i = threadIdx.x; i < sources * blocks && *vfailed == 0; i += blockDim.x) {
    const int source = i / blocks;
    if (source == skip) continue;
    const uint64_t* flag = flags + static_cast<size_t>(source) * kEpMaxBlocks + i % blocks;
    for (uint32_t spins = 1; LoadAcquire(flag) < target; ++spins) {
      if ((spins & 127) != 0) continue;
      if (*reinterpret_cast<volatile int32_t*>(error) != 0 || *vfailed != 0) {
        *vfailed = 1;
        break;
      }
      if (GlobalTimerNs() > deadline) {
        atomicCAS(error, 0, kEpErrorBase + op * 65536 + first_rank + source);
        *vfailed = 1;
        break;
      }
    }
  }
  __syncthreads();
  const bool ok = *vfailed == 0;
  __syncthreads();
  return ok;
}

// After this block's writes into peers: raises its flag word `offset +
// index * kEpMaxBlocks + block` in each world rank first .. first + count - 1
// except `skip`. One thread fences (cumulative over the block's writes, which
// the barrier ordered before it) and stores every flag.
__device__ void SignalPeers(const EpLaunch& l, size_t offset, int index, int first, int count,
                            int skip, uint64_t epoch) {
  __syncthreads();
  if (threadIdx.x != 0) return;
  __threadfence_system();
  for (int q = 0; q < count; ++q) {
    if (first + q == skip) continue;
    StoreRelaxed(
        l.peers[first + q].flags + offset + static_cast<size_t>(index) * kEpMaxBlocks + blockIdx.x,
        epoch);
  }
}

// dst(i) = src(i) for the 16-byte vectors i = first, first + stride, ... < n,
// kUnroll loads in flight per thread.
template <typename Src, typename Dst>
__device__ __forceinline__ void CopyVectors(int64_t n, int64_t first, int64_t stride, Src src,
                                            Dst dst) {
  for (int64_t i = first; i < n; i += kUnroll * stride) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (i + u * stride < n) v[u] = src(i + u * stride);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (i + u * stride < n) dst(i + u * stride, v[u]);
    }
  }
}

__device__ __forceinline__ int64_t GridThread() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t GridThreads() {
  return static_cast<int64_t>(gridDim.x) * blockDim.x;
}

// Rows source `source` put into this rank's segment (clamped to the capacity).
__device__ __forceinline__ int SegmentCount(const int32_t* meta, int source, int cap) {
  const int count = __ldcg(meta + static_cast<size_t>(source) * (cap + 1));
  return count < 0 ? 0 : (count > cap ? cap : count);
}

// For each share token: its pairs ordered by ascending expert id (ties by
// choice), with their weights, so Combine sums in the contract's order.
__device__ void OrderShareTokens(const EpLaunch& l, const int32_t* topk_ids, const float* topk_w,
                                 int shares) {
  const EpShape& s = l.shape;
  const int k = s.top_k;
  for (int share = static_cast<int>(GridThread()); share < shares;
       share += static_cast<int>(GridThreads())) {
    const int t = share * s.tp_size + s.tp_rank;
    int key[kMaxTopK];
    int choice[kMaxTopK];
    for (int j = 0; j < k; ++j) {
      const int e = topk_ids[t * k + j];
      key[j] = (e >= 0 && e < s.num_experts) ? e : INT_MAX;
      choice[j] = j;
      for (int i = j; i > 0 && key[i - 1] > key[i]; --i) {
        const int kk = key[i - 1], cc = choice[i - 1];
        key[i - 1] = key[i];
        choice[i - 1] = choice[i];
        key[i] = kk;
        choice[i] = cc;
      }
    }
    for (int r = 0; r < k; ++r) {
      l.state.order[share * k + r] = share * k + choice[r];
      l.state.order_w[share * k + r] = topk_w[t * k + choice[r]];
    }
  }
}

// Experts whose table (expert_first) a dispatch block stages in shared
// memory, so that a pair's destination takes one global load after its
// expert id instead of two; larger tables are read where they are.
constexpr int kStagedExperts = 512;

struct PlanShared {
  int count[kWarps][kEpMaxRanks];  // per warp and destination; then exclusive offsets
  int base[kEpMaxRanks];           // rows planned to each destination so far
  int4 list[kThreads];             // this block's pairs of the chunk: token, dest, pos, slot
  int list_len;
  int first[kStagedExperts + 1];  // the layer's expert_first, when it fits
  int broken;                     // the error word as the block started
  uint32_t epoch;                 // the dispatch's sequence number as it started
};

// Destination rank and slot of pair `n` of the share, or dest -1.
__device__ __forceinline__ int2 PairDestination(const EpShape& s, const int32_t* topk_ids,
                                                const int32_t* first, const int32_t* reps, int n,
                                                int* token) {
  const int share = n / s.top_k, j = n % s.top_k;
  const int t = share * s.tp_size + s.tp_rank;
  *token = t;
  const int e = topk_ids[t * s.top_k + j];
  if (e < 0 || e >= s.num_experts) return make_int2(-1, 0);
  const int f = first[e], replicas = first[e + 1] - f;
  if (replicas <= 0) return make_int2(-1, 0);
  const int loc = reps[f + EpReplicaIndex(t, j, replicas)];
  return make_int2(loc >> 16, loc & 0xffff);
}

// Copies the chunk's pairs this block owns: rows into their destination's
// x, slots into its meta.
__device__ void SendListedRows(const EpLaunch& l, const uint16_t* x, const PlanShared& sh) {
  const EpShape& s = l.shape;
  const int vecs = s.hidden / 8;  // 16-byte vectors per bf16 row
  const int len = sh.list_len;
  CopyVectors(
      static_cast<int64_t>(len) * vecs, threadIdx.x, blockDim.x,
      [&](int64_t v) {
        const int4 e = sh.list[v / vecs];
        return __ldg(reinterpret_cast<const uint4*>(x + static_cast<size_t>(e.x) * s.hidden) +
                     v % vecs);
      },
      [&](int64_t v, uint4 value) {
        const int4 e = sh.list[v / vecs];
        const int segment = l.ipc ? s.rank : e.y;
        uint4* row = reinterpret_cast<uint4*>(
            l.peers[e.y].x + static_cast<size_t>(segment * s.cap + e.z) * s.hidden);
        row[v % vecs] = value;
      });
  for (int r = threadIdx.x; r < len; r += blockDim.x) {
    const int4 e = sh.list[r];
    const int segment = l.ipc ? s.rank : e.y;
    l.peers[e.y].meta[static_cast<size_t>(segment) * (s.cap + 1) + 1 + e.z] = e.w;
  }
}

// Every block scans all pairs in chunks of kThreads to learn each pair's
// position (its rank among earlier pairs to the same destination), and sends
// the pairs n with n % gridDim.x == blockIdx.x. Block 0 writes the counts.
__device__ void PlanAndSend(const EpLaunch& l, const uint16_t* x, const int32_t* topk_ids,
                            const int32_t* first, const int32_t* reps, int pairs, PlanShared& sh) {
  const EpShape& s = l.shape;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int d = threadIdx.x; d < s.world; d += blockDim.x) sh.base[d] = 0;
  for (int chunk = 0; chunk < pairs; chunk += kThreads) {
    for (int i = threadIdx.x; i < kWarps * s.world; i += blockDim.x) {
      sh.count[i / s.world][i % s.world] = 0;
    }
    if (threadIdx.x == 0) sh.list_len = 0;
    __syncthreads();
    const int n = chunk + threadIdx.x;
    int token = 0;
    int2 dest = make_int2(-1, 0);
    if (n < pairs) dest = PairDestination(s, topk_ids, first, reps, n, &token);
    const unsigned same = __match_any_sync(0xffffffffu, dest.x);
    const int below = __popc(same & ((1u << lane) - 1));
    if (dest.x >= 0 && below == 0) sh.count[warp][dest.x] = __popc(same);
    __syncthreads();
    for (int d = threadIdx.x; d < s.world; d += blockDim.x) {
      int run = sh.base[d];
      for (int w = 0; w < kWarps; ++w) {
        const int c = sh.count[w][d];
        sh.count[w][d] = run;
        run += c;
      }
      sh.base[d] = run;
    }
    __syncthreads();
    if (n < pairs && n % gridDim.x == blockIdx.x) {
      int route = -1;
      if (dest.x >= 0) {
        const int pos = sh.count[warp][dest.x] + below;
        route = dest.x * s.cap + pos;
        sh.list[atomicAdd(&sh.list_len, 1)] = make_int4(token, dest.x, pos, dest.y);
      }
      l.state.route[n] = route;
    }
    __syncthreads();
    SendListedRows(l, x, sh);
    __syncthreads();
  }
  if (blockIdx.x == 0) {
    for (int d = threadIdx.x; d < s.world; d += blockDim.x) {
      const int segment = l.ipc ? s.rank : d;
      l.peers[d].meta[static_cast<size_t>(segment) * (s.cap + 1)] = sh.base[d];
    }
  }
}

// Receive side of a dispatch: slot and ones for every row (padding: -1 and
// 0) and the per-source counts. `out` needs no zeroing here: it is zero from
// creation, and every combine zeroes the rows it returned (no kernel writes
// padding rows), so every row is zero again before the next dispatch.
__device__ void Unpack(const EpLaunch& l) {
  const EpShape& s = l.shape;
  const int rows = s.world * s.cap;
  for (int r = static_cast<int>(GridThread()); r < rows; r += static_cast<int>(GridThreads())) {
    const int source = r / s.cap, i = r % s.cap;
    // The count and the slot loaded together (a padding row's slot is
    // read and dropped).
    const int32_t slot = __ldcg(l.self.meta + static_cast<size_t>(source) * (s.cap + 1) + 1 + i);
    const bool real = i < SegmentCount(l.self.meta, source, s.cap);
    l.state.slot[r] = real ? slot : -1;
    l.state.ones[r] = real ? 1.0f : 0.0f;
  }
  if (blockIdx.x == 0) {
    for (int p = threadIdx.x; p < s.world; p += blockDim.x) {
      l.state.recv_count[p] = SegmentCount(l.self.meta, p, s.cap);
    }
  }
}

__global__ void __launch_bounds__(kThreads)
    DispatchKernel(EpLaunch l, const uint16_t* x, const int32_t* topk_ids, const float* topk_w,
                   int tokens, const int32_t* first, const int32_t* reps) {
  __shared__ PlanShared sh;
  const EpShape& s = l.shape;
  // The error word, the sequence number and the expert table are loaded
  // together (one memory latency, not three).
  if (threadIdx.x == 0) {
    sh.broken = *reinterpret_cast<const volatile int32_t*>(l.state.error);
    sh.epoch = *reinterpret_cast<const volatile uint32_t*>(l.state.epochs + kDispatchEpoch);
  }
  const bool staged = s.num_experts <= kStagedExperts;
  if (staged) {
    for (int e = threadIdx.x; e <= s.num_experts; e += blockDim.x) sh.first[e] = first[e];
  }
  __syncthreads();
  if (sh.broken != 0) return;
  if (staged) first = sh.first;
  const uint64_t deadline = GlobalTimerNs() + l.timeout_ns;
  // The n-th dispatch waits for sequence number n; the combines advance it.
  const uint64_t epoch = static_cast<uint64_t>(sh.epoch) + 1;
  if (l.ipc) AdvanceNext(l.state, kCombineEpoch);
  const int shares = EpShareTokens(tokens, s.tp_size, s.tp_rank);
  OrderShareTokens(l, topk_ids, topk_w, shares);
  PlanAndSend(l, x, topk_ids, first, reps, shares * s.top_k, sh);
  if (!l.ipc) return;
  const EpFlagLayout flags{s.world, s.tp_size};
  SignalPeers(l, flags.dispatch(), s.rank, 0, s.world, -1, epoch);
  if (!WaitFlags(l.self.flags + flags.dispatch(), s.world, gridDim.x, -1, epoch, deadline,
                 l.state.error, kEpOpDispatch, 0)) {
    return;
  }
  Unpack(l);
}

__global__ void __launch_bounds__(kThreads) UnpackKernel(EpLaunch l) {
  if (BlockBroken(l.state.error)) return;
  Unpack(l);
}

// The lines of `combined` element `at` (four values: two lines).
__device__ __forceinline__ const uint32_t* CombinedLines(const EpLaunch& l, size_t at) {
  return l.self.combined_ll + at * 2;
}

// y rows of the share: the sum over each token's pairs in ascending expert
// id of weight * output, multiplied and added with one rounding each (no
// contraction) so a host reference can reproduce the bits. With
// `to_gather`, the rows also go to the TP peers' gathered buffers. With a
// line epoch the outputs are read from `combined_ll`, all of a thread's
// lines waited for together (WaitAllLines), and the rows go to the TP peers
// as lines in `gathered_ll` when `gather_lines`; false when a wait failed.
__device__ bool ReduceShare(const EpLaunch& l, float* y, int shares, bool to_gather,
                            uint32_t line_epoch = 0, uint64_t deadline = 0,
                            bool gather_lines = false) {
  const EpShape& s = l.shape;
  const int k = s.top_k, vecs = s.hidden / 4;
  const int group_first = s.rank - s.tp_rank;
  for (int64_t idx = GridThread(); idx < static_cast<int64_t>(shares) * vecs;
       idx += GridThreads()) {
    const int share = static_cast<int>(idx / vecs), q = static_cast<int>(idx % vecs);
    const int t = share * s.tp_size + s.tp_rank;
    // All outputs loaded before any is used: k loads in flight, not one.
    float4 o[kMaxTopK];
    uint4 lines[2 * kMaxTopK];
    size_t from[kMaxTopK];
    float w[kMaxTopK];
    bool valid[kMaxTopK];
    // The share's routes (by choice) and its order loaded together, then
    // matched in registers: one memory latency, not two.
    int routes[kMaxTopK], order[kMaxTopK];
#pragma unroll
    for (int r = 0; r < kMaxTopK; ++r) {
      if (r >= k) continue;
      routes[r] = l.state.route[share * k + r];
      order[r] = l.state.order[share * k + r] - share * k;
    }
#pragma unroll
    for (int r = 0; r < kMaxTopK; ++r) {
      valid[r] = false;
      if (r >= k) continue;
      int route = -1;
#pragma unroll
      for (int j = 0; j < kMaxTopK; ++j) {
        if (j < k && order[r] == j) route = routes[j];
      }
      if (route < 0) continue;
      valid[r] = true;
      w[r] = l.state.order_w[share * k + r];
      from[r] = static_cast<size_t>(route) * s.hidden + 4 * q;
      if (line_epoch == 0) {
        o[r] = __ldcg(reinterpret_cast<const float4*>(l.self.combined + from[r]));
      } else {
        lines[2 * r] = LoadLine(CombinedLines(l, from[r]));
        lines[2 * r + 1] = LoadLine(CombinedLines(l, from[r]) + 4);
      }
    }
    if (line_epoch != 0) {
      const uint32_t* at[2 * kMaxTopK];
      int source[2 * kMaxTopK];
#pragma unroll
      for (int r = 0; r < kMaxTopK; ++r) {
        at[2 * r] = valid[r] ? CombinedLines(l, from[r]) : nullptr;
        at[2 * r + 1] = valid[r] ? at[2 * r] + 4 : nullptr;
        source[2 * r] = source[2 * r + 1] =
            valid[r] ? static_cast<int>(from[r] / (static_cast<size_t>(s.cap) * s.hidden)) : 0;
      }
      if (!WaitAllLines(at, lines, source, line_epoch, deadline, l.state.error, kEpOpCombine)) {
        return false;
      }
#pragma unroll
      for (int r = 0; r < kMaxTopK; ++r) {
        const float2 a = ValuesOf(lines[2 * r]), b = ValuesOf(lines[2 * r + 1]);
        o[r] = make_float4(a.x, a.y, b.x, b.y);
      }
    }
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    bool first = true;
#pragma unroll
    for (int r = 0; r < kMaxTopK; ++r) {
      if (!valid[r]) continue;
      const float4 p = make_float4(__fmul_rn(w[r], o[r].x), __fmul_rn(w[r], o[r].y),
                                   __fmul_rn(w[r], o[r].z), __fmul_rn(w[r], o[r].w));
      acc = first ? p
                  : make_float4(__fadd_rn(acc.x, p.x), __fadd_rn(acc.y, p.y), __fadd_rn(acc.z, p.z),
                                __fadd_rn(acc.w, p.w));
      first = false;
    }
    const size_t at = static_cast<size_t>(t) * s.hidden + 4 * q;
    *reinterpret_cast<float4*>(y + at) = acc;
    if (!to_gather) continue;
    for (int peer = 0; peer < s.tp_size; ++peer) {
      if (peer == s.tp_rank) continue;
      if (gather_lines) {
        StorePayloadLines(l.peers[group_first + peer].gathered_ll + at * 2,
                          make_uint4(__float_as_uint(acc.x), __float_as_uint(acc.y),
                                     __float_as_uint(acc.z), __float_as_uint(acc.w)),
                          line_epoch);
        continue;
      }
      *reinterpret_cast<float4*>(l.peers[group_first + peer].gathered + at) = acc;
    }
  }
  return true;
}

// Rows of tokens outside this rank's share from the TP peers' lines in
// `gathered_ll`, kUnroll 16-byte vectors a thread waited for together
// (WaitAllLines); false when a wait failed.
__device__ bool FillOtherSharesFromLines(const EpLaunch& l, float* y, int tokens, uint32_t epoch,
                                         uint64_t deadline) {
  const EpShape& s = l.shape;
  const int vecs = s.hidden / 4;
  const int64_t n = static_cast<int64_t>(tokens) * vecs;
  const int64_t stride = GridThreads();
  for (int64_t i = GridThread(); i < n; i += kUnroll * stride) {
    const uint32_t* at[2 * kUnroll];
    uint4 lines[2 * kUnroll];
    int owner[2 * kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t v = i + u * stride;
      const int token = static_cast<int>(v / vecs);
      at[2 * u] = at[2 * u + 1] = nullptr;
      owner[2 * u] = owner[2 * u + 1] = s.rank - s.tp_rank + token % s.tp_size;
      if (v >= n || token % s.tp_size == s.tp_rank) continue;
      at[2 * u] = l.self.gathered_ll + v * 8;
      at[2 * u + 1] = at[2 * u] + 4;
      lines[2 * u] = LoadLine(at[2 * u]);
      lines[2 * u + 1] = LoadLine(at[2 * u + 1]);
    }
    if (!WaitAllLines(at, lines, owner, epoch, deadline, l.state.error, kEpOpGather)) return false;
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (at[2 * u] == nullptr) continue;
      const uint2 a = WordsOf(lines[2 * u]), b = WordsOf(lines[2 * u + 1]);
      reinterpret_cast<uint4*>(y)[i + u * stride] = make_uint4(a.x, a.y, b.x, b.y);
    }
  }
  return true;
}

// Rows of tokens outside this rank's share: copied from `from` (the TP
// peers' rows), or zeroed when `from` is null.
__device__ void FillOtherShares(const EpShape& s, float* y, int tokens, const float* from) {
  const int vecs = s.hidden / 4;
  CopyVectors(
      static_cast<int64_t>(tokens) * vecs, GridThread(), GridThreads(),
      [&](int64_t v) {
        const bool other = (v / vecs) % s.tp_size != s.tp_rank;
        return other && from != nullptr ? __ldcg(reinterpret_cast<const uint4*>(from) + v)
                                        : make_uint4(0, 0, 0, 0);
      },
      [&](int64_t v, uint4 value) {
        if ((v / vecs) % s.tp_size != s.tp_rank) reinterpret_cast<uint4*>(y)[v] = value;
      });
}

// Moves the out rows of every source's real rows into that source's
// `combined` (segment of this rank), or with a line epoch into its
// `combined_ll` as flagged lines, or (send false) only zeroes them: each
// thread zeroes what it read itself, so out is zero for the next dispatch
// without a pass of its own.
// `counts` holds the rows received from each source (recv_count, or a
// copy of it).
__device__ void SendOutputs(const EpLaunch& l, const int32_t* counts, bool send,
                            uint32_t line_epoch = 0) {
  const EpShape& s = l.shape;
  const int vecs = s.hidden / 4;
  for (int p = 0; p < s.world; ++p) {
    const int64_t n = static_cast<int64_t>(counts[p]) * vecs;
    uint4* src = reinterpret_cast<uint4*>(l.state.out + static_cast<size_t>(p) * s.cap * s.hidden);
    const size_t segment = static_cast<size_t>(s.rank) * s.cap * s.hidden;
    uint4* dst =
        send && line_epoch == 0 ? reinterpret_cast<uint4*>(l.peers[p].combined + segment) : nullptr;
    uint32_t* lines = send && line_epoch != 0 ? l.peers[p].combined_ll + segment * 2 : nullptr;
    CopyVectors(
        n, GridThread(), GridThreads(), [&](int64_t v) { return src[v]; },
        [&](int64_t v, uint4 value) {
          if (dst != nullptr) dst[v] = value;
          if (lines != nullptr) StorePayloadLines(lines + 8 * v, value, line_epoch);
          src[v] = make_uint4(0, 0, 0, 0);
        });
  }
}

__global__ void __launch_bounds__(kThreads) CombineIpcKernel(EpLaunch l, float* y, int tokens) {
  const EpShape& s = l.shape;
  // The error word, the sequence number and the received counts loaded
  // together (one memory latency, not three).
  __shared__ int broken;
  __shared__ uint32_t launch_epoch;
  __shared__ int32_t counts[kEpMaxRanks];
  if (threadIdx.x == 0) {
    broken = *reinterpret_cast<const volatile int32_t*>(l.state.error);
    launch_epoch = *reinterpret_cast<const volatile uint32_t*>(l.state.epochs + kCombineEpoch);
  }
  for (int p = threadIdx.x; p < s.world; p += blockDim.x) counts[p] = l.state.recv_count[p];
  __syncthreads();
  if (broken != 0) return;
  const uint64_t deadline = GlobalTimerNs() + l.timeout_ns;
  // The n-th combine waits for n, which the n-th dispatch set.
  const uint64_t epoch = launch_epoch;
  AdvanceNext(l.state, kDispatchEpoch);
  const EpFlagLayout flags{s.world, s.tp_size};
  const int shares = EpShareTokens(tokens, s.tp_size, s.tp_rank);
  const bool gather = s.tp_size > 1;
  // The number 0 is what zeroed lines hold: that combine uses flags.
  if (CombineAsLines(l) && static_cast<uint32_t>(epoch) != 0) {
    // Small steps: the outputs go as flagged lines and are waited for where
    // they are read; no fence, no flag round trip. So do the finished rows
    // the TP peers trade.
    const uint32_t line_epoch = static_cast<uint32_t>(epoch);
    const bool gather_lines = gather && GatherAsLines(l, tokens);
    SendOutputs(l, counts, /*send=*/true, line_epoch);
    bool ok = ReduceShare(l, y, shares, gather, line_epoch, deadline, gather_lines);
    if (ok && gather_lines) ok = FillOtherSharesFromLines(l, y, tokens, line_epoch, deadline);
    if (__syncthreads_or(!ok) || gather_lines) return;
  } else {
    SendOutputs(l, counts, /*send=*/true);
    SignalPeers(l, flags.combine(), s.rank, 0, s.world, -1, epoch);
    if (!WaitFlags(l.self.flags + flags.combine(), s.world, gridDim.x, -1, epoch, deadline,
                   l.state.error, kEpOpCombine, 0)) {
      return;
    }
    ReduceShare(l, y, shares, gather);
  }
  if (gather) {
    const int group_first = s.rank - s.tp_rank;
    SignalPeers(l, flags.gather(), s.tp_rank, group_first, s.tp_size, s.rank, epoch);
    if (!WaitFlags(l.self.flags + flags.gather(), s.tp_size, gridDim.x, s.tp_rank, epoch, deadline,
                   l.state.error, kEpOpGather, group_first)) {
      return;
    }
    FillOtherShares(s, y, tokens, l.self.gathered);
  }
}

__global__ void __launch_bounds__(kThreads) CombinePackedKernel(EpLaunch l, float* y, int tokens) {
  if (BlockBroken(l.state.error)) return;
  const EpShape& s = l.shape;
  ReduceShare(l, y, EpShareTokens(tokens, s.tp_size, s.tp_rank), /*to_gather=*/false);
  FillOtherShares(s, y, tokens, nullptr);
  SendOutputs(l, l.state.recv_count, /*send=*/false);  // NCCL has sent them; zero them
}

// This block's slice [lo, hi) of the round starting at `base`, relative to it.
__device__ __forceinline__ int2 ReduceSlice(int64_t count, int64_t base) {
  const int64_t round_len = min(count - base, static_cast<int64_t>(gridDim.x) * kEpReduceChunk);
  int64_t per = (round_len + gridDim.x - 1) / gridDim.x;
  per = (per + 3) / 4 * 4;
  const int64_t lo = min(round_len, per * blockIdx.x);
  const int64_t hi = min(round_len, lo + per);
  return make_int2(static_cast<int>(lo), static_cast<int>(hi));
}

__device__ __forceinline__ float* ReducePart(float* reduce, int tp, int parity, int part) {
  return reduce +
         (static_cast<size_t>(parity * tp + part) * kEpMaxBlocks + blockIdx.x) * kEpReduceChunk;
}

// Copies this block's slice of the round to every TP peer.
__device__ void SendReduceSlice(const EpLaunch& l, const float* mine, int2 slice, int parity) {
  const EpShape& s = l.shape;
  const int group_first = s.rank - s.tp_rank;
  const int n = slice.y - slice.x;
  const bool vector = (reinterpret_cast<uintptr_t>(mine + slice.x) % 16) == 0;
  for (int peer = 0; peer < s.tp_size; ++peer) {
    if (peer == s.tp_rank) continue;
    float* dst = ReducePart(l.peers[group_first + peer].reduce, s.tp_size, parity, s.tp_rank);
    const int vecs = vector ? n / 4 : 0;
    CopyVectors(
        vecs, threadIdx.x, blockDim.x,
        [&](int64_t v) { return reinterpret_cast<const uint4*>(mine + slice.x)[v]; },
        [&](int64_t v, uint4 value) { reinterpret_cast<uint4*>(dst)[v] = value; });
    for (int i = 4 * vecs + threadIdx.x; i < n; i += blockDim.x) dst[i] = mine[slice.x + i];
  }
}

// Sums the slice over the TP group in TP-rank order into `mine`.
__device__ void SumReduceSlice(const EpLaunch& l, float* mine, int2 slice, int parity) {
  const EpShape& s = l.shape;
  for (int i = slice.x + threadIdx.x; i < slice.y; i += blockDim.x) {
    float acc = 0.f;
    for (int part = 0; part < s.tp_size; ++part) {
      const float v =
          part == s.tp_rank
              ? mine[i]
              : __ldcg(ReducePart(l.self.reduce, s.tp_size, parity, part) + (i - slice.x));
      acc = part == 0 ? v : __fadd_rn(acc, v);
    }
    mine[i] = acc;
  }
}

__global__ void __launch_bounds__(kThreads)
    AllReduceKernel(EpLaunch l, float* data, int64_t count) {
  if (BlockBroken(l.state.error)) return;
  const uint64_t deadline = GlobalTimerNs() + l.timeout_ns;
  const EpShape& s = l.shape;
  const EpFlagLayout flags{s.world, s.tp_size};
  const int group_first = s.rank - s.tp_rank;
  const uint64_t first_epoch = LaunchEpoch(l.state, kReduceEpoch + blockIdx.x);
  const int64_t round_len = static_cast<int64_t>(gridDim.x) * kEpReduceChunk;
  uint32_t rounds = 0;
  for (int64_t base = 0; base < count; base += round_len, ++rounds) {
    const uint64_t epoch = first_epoch + rounds + 1;
    const int parity = static_cast<int>(epoch & 1);
    const int2 slice = ReduceSlice(count, base);
    SendReduceSlice(l, data + base, slice, parity);
    SignalPeers(l, flags.reduce(), s.tp_rank, group_first, s.tp_size, s.rank, epoch);
    // Only this block's slices matter: wait for the same block of each peer.
    if (!WaitFlags(l.self.flags + flags.reduce() + blockIdx.x, s.tp_size, 1, s.tp_rank, epoch,
                   deadline, l.state.error, kEpOpReduce, group_first)) {
      return;
    }
    SumReduceSlice(l, data + base, slice, parity);
    __syncthreads();
  }
  __syncthreads();
  if (threadIdx.x == 0) l.state.epochs[kReduceEpoch + blockIdx.x] += rounds;
}

// Sends this thread's lines to every TP peer, then sums each line over the
// group in TP-rank order (ep_lines.cuh).
__global__ void __launch_bounds__(kThreads)
    AllReduceLinesKernel(EpLaunch l, float* data, int64_t count, float* residual) {
  if (BlockBroken(l.state.error)) return;
  const uint64_t deadline = GlobalTimerNs() + l.timeout_ns;
  const uint32_t epoch = TpLinesEpoch(l);
  const int64_t lines = count / 2;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  float2* mine = reinterpret_cast<float2*>(data);
  for (int64_t i = first; i < lines; i += stride) SendTpLine(l, epoch, i, mine[i]);
  for (int64_t i = first; i < lines; i += stride) {
    float2 acc;
    if (!SumTpLine(l, epoch, i, mine[i], deadline, &acc)) break;
    if (residual == nullptr) {
      mine[i] = acc;
      continue;
    }
    float2* r = reinterpret_cast<float2*>(residual) + i;
    const float2 before = *r;
    *r = make_float2(__fadd_rn(before.x, acc.x), __fadd_rn(before.y, acc.y));
    mine[i] = make_float2(0.f, 0.f);
  }
  TpLinesBlockDone(l, epoch, gridDim.x);
}

__global__ void AddAndZeroKernel(float* residual, float* part, int64_t count) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    residual[i] = __fadd_rn(residual[i], part[i]);
    part[i] = 0.f;
  }
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

bool ValidShape(const EpLaunch& l) {
  const EpShape& s = l.shape;
  return s.world >= 1 && s.world <= kEpMaxRanks && s.rank >= 0 && s.rank < s.world &&
         s.tp_size >= 1 && s.world % s.tp_size == 0 && s.tp_rank == s.rank % s.tp_size &&
         s.hidden > 0 && s.hidden % 8 == 0 && s.top_k >= 1 && s.top_k <= kMaxTopK && s.cap >= 0 &&
         s.max_blocks >= 2 && s.max_blocks <= kEpMaxBlocks && l.peers != nullptr &&
         l.state.error != nullptr && l.state.epochs != nullptr;
}

// The same on every rank of a step (a function of the shared cap): flags
// count the blocks of each source. A combine sent as lines gets a block per
// kThreads * kUnroll lines of the rows it may return.
unsigned ExchangeGrid(const EpLaunch& l, bool combine = false) {
  const EpShape& s = l.shape;
  int blocks = EpExchangeBlocks(s.cap, s.max_blocks);
  if (combine && CombineAsLines(l)) {
    const int64_t lines = static_cast<int64_t>(s.world) * s.cap * (s.hidden / 2);
    const int64_t per_block = static_cast<int64_t>(kThreads) * kUnroll;
    blocks = static_cast<int>(std::max<int64_t>(
        blocks, std::min<int64_t>((lines + per_block - 1) / per_block, s.max_blocks)));
  }
  return static_cast<unsigned>(blocks);
}

// Resident blocks of `kernel` on one multiprocessor.
template <typename Kernel>
int BlocksPerSm(Kernel kernel) {
  int blocks = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, kThreads, 0) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return blocks;
}

}  // namespace

cudaError_t LaunchEpDispatch(const EpLaunch& l, const uint16_t* x, const int32_t* topk_ids,
                             const float* topk_w, int tokens, const int32_t* expert_first,
                             const int32_t* expert_reps, cudaStream_t stream) {
  if (!ValidShape(l) || tokens < 0 || expert_first == nullptr || expert_reps == nullptr ||
      (tokens > 0 && (x == nullptr || topk_ids == nullptr || topk_w == nullptr)) || !Aligned16(x)) {
    return cudaErrorInvalidValue;
  }
  DispatchKernel<<<ExchangeGrid(l), kThreads, 0, stream>>>(l, x, topk_ids, topk_w, tokens,
                                                           expert_first, expert_reps);
  return cudaGetLastError();
}

cudaError_t LaunchEpUnpack(const EpLaunch& l, cudaStream_t stream) {
  if (!ValidShape(l)) return cudaErrorInvalidValue;
  UnpackKernel<<<ExchangeGrid(l), kThreads, 0, stream>>>(l);
  return cudaGetLastError();
}

cudaError_t LaunchEpCombine(const EpLaunch& l, float* y, int tokens, cudaStream_t stream) {
  if (!ValidShape(l) || tokens < 0 || (tokens > 0 && y == nullptr) || !Aligned16(y)) {
    return cudaErrorInvalidValue;
  }
  if (l.ipc) {
    CombineIpcKernel<<<ExchangeGrid(l, /*combine=*/true), kThreads, 0, stream>>>(l, y, tokens);
  } else {
    CombinePackedKernel<<<ExchangeGrid(l), kThreads, 0, stream>>>(l, y, tokens);
  }
  return cudaGetLastError();
}

cudaError_t LaunchEpAllReduce(const EpLaunch& l, float* data, int64_t count, cudaStream_t stream,
                              float* residual) {
  if (!ValidShape(l) || !l.ipc || count < 0 || (count > 0 && data == nullptr)) {
    return cudaErrorInvalidValue;
  }
  if (count == 0) return cudaSuccess;
  if (l.shape.tp_size == 1) {
    return residual == nullptr ? cudaSuccess : LaunchEpAddAndZero(residual, data, count, stream);
  }
  const bool lines = count % 2 == 0 && count <= l.self.ll_count && l.self.ll != nullptr &&
                     reinterpret_cast<uintptr_t>(data) % 8 == 0 &&
                     reinterpret_cast<uintptr_t>(residual) % 8 == 0;
  if (lines) {
    const int64_t blocks = (count / 2 + kThreads - 1) / kThreads;
    AllReduceLinesKernel<<<static_cast<unsigned>(std::min<int64_t>(blocks, l.shape.max_blocks)),
                           kThreads, 0, stream>>>(l, data, count, residual);
    return cudaGetLastError();
  }
  AllReduceKernel<<<EpReduceBlocks(count, l.shape.max_blocks), kThreads, 0, stream>>>(l, data,
                                                                                      count);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess || residual == nullptr) return err;
  return LaunchEpAddAndZero(residual, data, count, stream);
}

cudaError_t LaunchEpAddAndZero(float* residual, float* part, int64_t count, cudaStream_t stream) {
  if (count < 0 || (count > 0 && (residual == nullptr || part == nullptr))) {
    return cudaErrorInvalidValue;
  }
  if (count == 0) return cudaSuccess;
  const int64_t blocks = std::min<int64_t>((count + kThreads - 1) / kThreads, 1024);
  AddAndZeroKernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(residual, part, count);
  return cudaGetLastError();
}

int EpResidentBlocks(int device) {
  int sms = 0, current = 0;
  if (cudaGetDevice(&current) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  if (current != device && cudaSetDevice(device) != cudaSuccess) return 0;
  const int per_sm = std::min({BlocksPerSm(DispatchKernel), BlocksPerSm(CombineIpcKernel),
                               BlocksPerSm(AllReduceKernel), BlocksPerSm(AllReduceLinesKernel),
                               BlocksPerSm(UnpackKernel), BlocksPerSm(CombinePackedKernel)});
  if (current != device) cudaSetDevice(current);
  return sms * per_sm;
}

}  // namespace flotilla::kernels::cuda
