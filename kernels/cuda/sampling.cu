// GPU sampling over f32 logits, no sort. Two kernels per call:
//
// - SegmentKernel, up to 256 blocks split over the rows (a row of 201088 ids
//   in ~2k-id segments when there are few rows): online max / sum of exp over
//   the raw logits (log-softmax normaliser for the reported logprobs) and the
//   argmax (ties: lower id); for rows without top-k / top-p / min-p the draw
//   itself (the race below); for few rows, each thread's top 20 raw keys.
// - SampleKernel, one block of 512 threads per row: merges the segments, and
//   for filtered rows runs the filters and the draw over the row.
//
// Filters work on the CPU sampler's own weights p = exp(l * (1/T) - max / T)
// (the same float operations, no FMA) and on the 64-bit key
// (bits(p) << 32 | ~id): distinct for every id and ordered exactly as the CPU
// ranks (larger p first, then lower id). Every filter keeps a prefix of that
// order, so the kept set is "key >= threshold". top-k's threshold is the k-th
// largest key and top-p's the key where the mass (summed from the top, within
// the top-k set) first reaches top_p of the total: both are found by a radix
// select (11-bit digits, a histogram pass over the row per digit, stopping as
// soon as the boundary bin is resolved). min-p keeps p >= min_p.
//
// The draw is an exponential race (Gumbel-max): the kept id with the largest
// l / T - log(-log u_id) wins, u_id from Philox-4x32-10 keyed by the row's seed
// with the counter (id / 4, step). This picks id with probability
// p_id / sum(kept p), needs no normalisation pass, splits over segments, and
// the same (seed, step) gives the same token.
//
// top_n logprobs: from the segments' per-thread lists (few rows, top_n <= 20)
// or by the same radix select over the raw logits' keys.
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include <algorithm>
#include <cfloat>
#include <climits>

#include "kernels/cuda/sampling.h"

namespace flotilla::kernels::cuda {
namespace {

constexpr int kThreads = 512;
constexpr int kBins = 2048;  // 11-bit digits
constexpr int kPer = kBins / kThreads;
constexpr int kMaxTopN = 64;
constexpr int kUnroll = 4;  // float4 loads in flight per thread and pass

// Philox-4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3").
__device__ __forceinline__ uint4 Philox(uint4 c, uint2 k) {
#pragma unroll
  for (int r = 0; r < 10; ++r) {
    const uint32_t hi0 = __umulhi(0xD2511F53u, c.x), lo0 = 0xD2511F53u * c.x;
    const uint32_t hi1 = __umulhi(0xCD9E8D57u, c.z), lo1 = 0xCD9E8D57u * c.z;
    c = make_uint4(hi1 ^ c.y ^ k.x, lo1, hi0 ^ c.w ^ k.y, lo0);
    k.x += 0x9E3779B9u;
    k.y += 0xBB67AE85u;
  }
  return c;
}

// u in (0, 1) from 24 random bits.
__device__ __forceinline__ float Uniform(uint32_t bits) {
  return (static_cast<float>(bits >> 8) + 0.5f) * (1.0f / 16777216.0f);
}

__device__ __forceinline__ uint32_t Orderable(float v) {
  const uint32_t u = __float_as_uint(v);
  return u ^ ((u >> 31) ? 0xFFFFFFFFu : 0x80000000u);
}

__device__ __forceinline__ uint64_t RawKey(float v, int i) {
  return (static_cast<uint64_t>(Orderable(v)) << 32) | static_cast<uint32_t>(~i);
}

// p >= 0, so its bit pattern is ordered like its value.
__device__ __forceinline__ uint64_t PKey(float p, int i) {
  return (static_cast<uint64_t>(__float_as_uint(p)) << 32) | static_cast<uint32_t>(~i);
}

// Calls f(id, value) for every id in [begin, end) of the row, kUnroll 16-byte
// loads in flight per thread (when the row is 16-byte aligned; begin % 4 == 0).
template <int kBlock, typename F>
__device__ __forceinline__ void ForEach(const float* __restrict__ row, int begin, int end, bool vec,
                                        F&& f) {
  int done = begin;
  if (vec) {
    const float4* r4 = reinterpret_cast<const float4*>(row + begin);
    const int n4 = (end - begin) >> 2;
    for (int base = 0; base < n4; base += kBlock * kUnroll) {
      float4 v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int j = base + u * kBlock + static_cast<int>(threadIdx.x);
        if (j < n4) v[u] = __ldg(r4 + j);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int j = base + u * kBlock + static_cast<int>(threadIdx.x);
        if (j < n4) {
          const int i = begin + 4 * j;
          f(i, v[u].x);
          f(i + 1, v[u].y);
          f(i + 2, v[u].z);
          f(i + 3, v[u].w);
        }
      }
    }
    done = begin + (n4 << 2);
  }
  for (int i = done + static_cast<int>(threadIdx.x); i < end; i += kBlock) f(i, __ldg(row + i));
}

template <typename F>
__device__ __forceinline__ void ForEach(const float* __restrict__ row, int vocab, bool vec, F&& f) {
  ForEach<kThreads>(row, 0, vocab, vec, f);
}

struct MaxSum {
  float m;
  float s;
  int arg;
};

__device__ __forceinline__ MaxSum Merge(MaxSum a, MaxSum b) {
  MaxSum r;
  r.m = fmaxf(a.m, b.m);
  if (r.m == -INFINITY) {
    r.s = 0.0f;
  } else {
    r.s = (a.m == -INFINITY ? 0.0f : a.s * expf(a.m - r.m)) +
          (b.m == -INFINITY ? 0.0f : b.s * expf(b.m - r.m));
  }
  if (b.arg != INT_MAX && (a.arg == INT_MAX || b.m > a.m || (b.m == a.m && b.arg < a.arg))) {
    r.arg = b.arg;
  } else {
    r.arg = a.arg;
  }
  return r;
}

struct MergeOp {
  __device__ __forceinline__ MaxSum operator()(const MaxSum& a, const MaxSum& b) const {
    return Merge(a, b);
  }
};

struct KeyMax {
  float score;
  int id;
};
struct KeyMaxOp {
  __device__ __forceinline__ KeyMax operator()(const KeyMax& a, const KeyMax& b) const {
    if (b.id == INT_MAX) return a;
    if (a.id == INT_MAX) return b;
    return (b.score > a.score || (b.score == a.score && b.id < a.id)) ? b : a;
  }
};

using ScanD = cub::BlockScan<double, kThreads>;
using ReduceMs = cub::BlockReduce<MaxSum, kThreads>;
using ReduceKm = cub::BlockReduce<KeyMax, kThreads>;

struct Shared {
  union {
    typename ScanD::TempStorage scan;
    typename ReduceMs::TempStorage reduce_ms;
    typename ReduceKm::TempStorage reduce_km;
  } cub;
  unsigned count[kBins];
  float mass[kBins];
  uint64_t result;
  double goal;       // top-p: the mass to reach
  double cum_above;  // weight above the boundary bin
  int found;
  MaxSum stats;
  int token;
  int n_top;
  uint64_t top_key[kMaxTopN];
  int top_id[kMaxTopN];
};

// Radix select over key(id, value) for the ids with key >= floor.
// kMass = false: the key of the `need`-th largest (1-based).
// kMass = true: the largest key t such that the weights of keys >= t sum to at
// least frac * (total weight); weight(id, value) >= 0.
// Returns a threshold: keep exactly the ids with key >= result.
template <bool kMass, typename KeyFn, typename WeightFn>
__device__ uint64_t RadixSelect(const float* row, int vocab, bool vec, uint64_t floor, double need,
                                KeyFn key_of, WeightFn weight_of, Shared& sh) {
  uint64_t prefix = 0;
  double above = 0;  // count or weight of the ids already known to be above the bin
  bool first = true;
  for (int shift = 53;; shift = shift >= 11 ? shift - 11 : 0) {
    const int width = shift >= 9 && shift != 0 ? 11 : 9;
    const int top = shift + width;
    const uint64_t hi_mask = top >= 64 ? 0ull : ~((1ull << top) - 1);
    for (int b = threadIdx.x; b < kBins; b += kThreads) {
      sh.count[b] = 0;
      sh.mass[b] = 0.0f;
    }
    __syncthreads();
    ForEach(row, vocab, vec, [&](int i, float v) {
      const uint64_t k = key_of(i, v);
      if (k < floor || (k & hi_mask) != prefix) return;
      const int d = static_cast<int>((k >> shift) & ((1u << width) - 1));
      atomicAdd(&sh.count[d], 1u);
      if (kMass) atomicAdd(&sh.mass[d], weight_of(i, v));
    });
    __syncthreads();
    // Descending bins: thread t owns bins kBins - 1 - kPer t - j, j < kPer.
    const int b0 = kBins - 1 - kPer * static_cast<int>(threadIdx.x);
    double vals[kPer];
    double mine = 0;
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      vals[j] = kMass ? static_cast<double>(sh.mass[b0 - j]) : sh.count[b0 - j];
      mine += vals[j];
    }
    double cum, total;
    ScanD(sh.cub.scan).ExclusiveSum(mine, cum, total);
    if (threadIdx.x == 0) {
      sh.found = 0;
      if (kMass && first) sh.goal = need * total;  // need = frac of the set's total
    }
    __syncthreads();
    const double target = kMass && first ? sh.goal : need;
    cum += above;
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int b = b0 - j;
      if (sh.count[b] > 0 && cum < target && target <= cum + vals[j]) {
        sh.found = 1;
        sh.result = (static_cast<uint64_t>(b) << 32) | sh.count[b];
        sh.cum_above = cum;
      }
      cum += vals[j];
    }
    __syncthreads();
    if (!sh.found) return floor;  // rounding left the target out of reach: keep all
    const uint64_t bin = sh.result >> 32;
    const unsigned in_bin = static_cast<unsigned>(sh.result & 0xFFFFFFFFu);
    const double new_above = sh.cum_above;
    __syncthreads();
    prefix |= bin << shift;
    if (kMass) {
      need = target;
      if (in_bin == 1 || shift == 0) return prefix;
    } else {
      // All of the bin is needed: its lowest key is the threshold.
      if (static_cast<double>(in_bin) == need - new_above || shift == 0) return prefix;
    }
    above = new_above;
    first = false;
  }
}

// Pass 1, split over many blocks per row: per segment of the row, the raw
// max / sum of exp / argmax and, for rows that draw without filters, the
// exponential race. The per-row kernel merges the segments.
constexpr int kSegThreads = 256;
constexpr int kTargetBlocks = 256;
constexpr int kMinSegment = 2048;

struct Partial {
  MaxSum ms;
  KeyMax race;
};

__host__ __device__ inline int Segments(int rows, int vocab) {
  const int by_len = (vocab + kMinSegment - 1) / kMinSegment;
  const int by_rows = (kTargetBlocks + rows - 1) / rows;
  const int s = by_len < by_rows ? by_len : by_rows;
  return s < 1 ? 1 : s;
}

__device__ __forceinline__ bool Unfiltered(const SamplingRow& p, int vocab) {
  return !(p.top_k > 0 && p.top_k < vocab) && !(p.top_p < 1.0f) && !(p.min_p > 0.0f);
}

// The race key of id i: l / T - log(-log u_i), u_i from Philox(seed; i / 4, step).
struct Race {
  float inv_t;
  uint2 key;
  uint32_t s_lo, s_hi;
  int group = -1;  // the 4 ids of a float4 share one Philox call
  uint4 rnd = make_uint4(0, 0, 0, 0);
  __device__ __forceinline__ explicit Race(const SamplingRow& p)
      : inv_t(1.0f / p.temperature),
        key(make_uint2(static_cast<uint32_t>(p.seed), static_cast<uint32_t>(p.seed >> 32))),
        s_lo(static_cast<uint32_t>(p.step)),
        s_hi(static_cast<uint32_t>(p.step >> 32)) {}
  __device__ __forceinline__ float Score(int i, float v) {
    if ((i >> 2) != group) {
      group = i >> 2;
      rnd = Philox(make_uint4(static_cast<uint32_t>(group), 0u, s_lo, s_hi), key);
    }
    const int lane = i & 3;
    const uint32_t bits = lane == 0 ? rnd.x : lane == 1 ? rnd.y : lane == 2 ? rnd.z : rnd.w;
    return v * inv_t - logf(-logf(Uniform(bits)));
  }
};

__device__ __forceinline__ void Offer(KeyMax& best, float score, int i) {
  if (best.id == INT_MAX || score > best.score || (score == best.score && i < best.id)) {
    best.score = score;
    best.id = i;
  }
}

__device__ __forceinline__ void Accumulate(MaxSum& ms, int i, float v) {
  if (v > ms.m) {
    ms.s = (ms.m == -INFINITY ? 0.0f : ms.s * expf(ms.m - v)) + 1.0f;
    ms.m = v;
    ms.arg = i;
  } else {
    if (ms.arg == INT_MAX) ms.arg = i;  // e.g. all -inf
    if (v != -INFINITY) ms.s += expf(v - ms.m);
  }
}

// Up to kSegTop (the OpenAI limit of 20) top logprobs come from the segments
// when they are short (few rows): each thread keeps its kSegTop largest raw
// keys in a sorted register list, the block extracts the segment's top_n from
// those lists, and the per-row kernel the row's top_n from the segments'.
// Long segments (the insertions then cost more than they save) or more than
// kSegTop: a radix select in the per-row kernel.
constexpr int kSegTop = 20;
constexpr int kSegTopMaxLen = 8192;

__device__ __forceinline__ uint64_t WarpMax(uint64_t v) {
  for (int o = 16; o > 0; o >>= 1) {
    const uint64_t t = __shfl_xor_sync(0xffffffffu, v, o);
    v = t > v ? t : v;
  }
  return v;
}

// Block-wide max of one u64 per thread (every thread gets it); scratch has
// blockDim.x / 32 entries.
template <int kBlock>
__device__ __forceinline__ uint64_t BlockMax(uint64_t v, uint64_t* scratch) {
  v = WarpMax(v);
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = v;
  __syncthreads();
  uint64_t b = 0;
#pragma unroll
  for (int w = 0; w < kBlock / 32; ++w) b = scratch[w] > b ? scratch[w] : b;
  __syncthreads();
  return b;
}

template <int kTop>
__global__ void __launch_bounds__(kSegThreads)
    SegmentKernel(const float* __restrict__ logits, int vocab, int segments,
                  const SamplingRow* __restrict__ params, int top_n, Partial* __restrict__ partials,
                  uint64_t* __restrict__ tops) {
  using ReduceSegMs = cub::BlockReduce<MaxSum, kSegThreads>;
  using ReduceSegKm = cub::BlockReduce<KeyMax, kSegThreads>;
  __shared__ union {
    typename ReduceSegMs::TempStorage ms;
    typename ReduceSegKm::TempStorage km;
  } tmp;
  __shared__ uint64_t cand[kTop > 0 ? kSegThreads : 1][kTop > 0 ? kTop : 1];
  __shared__ uint64_t scratch[kSegThreads / 32];
  const int r = blockIdx.y, seg = blockIdx.x;
  const float* row = logits + static_cast<size_t>(r) * vocab;
  const bool vec = (reinterpret_cast<uintptr_t>(row) & 15) == 0;
  const int len = (((vocab + segments - 1) / segments) + 3) & ~3;
  const int begin = min(vocab, seg * len), end = min(vocab, begin + len);
  const SamplingRow prm = params[r];
  const bool race = prm.temperature > 0.0f && Unfiltered(prm, vocab);
  MaxSum ms{-INFINITY, 0.0f, INT_MAX};
  KeyMax best{-INFINITY, INT_MAX};
  uint64_t list[kTop > 0 ? kTop : 1];  // descending; 0 = empty (no key is 0)
#pragma unroll
  for (int j = 0; j < (kTop > 0 ? kTop : 1); ++j) list[j] = 0;
  auto offer_top = [&](int i, float v) {
    if constexpr (kTop > 0) {
      const uint64_t k = RawKey(v, i);
      if (k > list[kTop - 1]) {
#pragma unroll
        for (int j = kTop - 1; j > 0; --j) {
          list[j] = k > list[j - 1] ? list[j - 1] : (k > list[j] ? k : list[j]);
        }
        list[0] = k > list[0] ? k : list[0];
      }
    }
  };
  if (race) {
    Race rc(prm);
    ForEach<kSegThreads>(row, begin, end, vec, [&](int i, float v) {
      Accumulate(ms, i, v);
      Offer(best, rc.Score(i, v), i);
      offer_top(i, v);
    });
  } else {
    ForEach<kSegThreads>(row, begin, end, vec, [&](int i, float v) {
      Accumulate(ms, i, v);
      offer_top(i, v);
    });
  }
  ms = ReduceSegMs(tmp.ms).Reduce(ms, MergeOp());
  __syncthreads();
  best = ReduceSegKm(tmp.km).Reduce(best, KeyMaxOp());
  if (threadIdx.x == 0) partials[static_cast<size_t>(r) * segments + seg] = Partial{ms, best};
  if constexpr (kTop > 0) {
#pragma unroll
    for (int j = 0; j < kTop; ++j) cand[threadIdx.x][j] = list[j];
    __syncthreads();
    uint64_t* out = tops + (static_cast<size_t>(r) * segments + seg) * kTop;
    int head = 0;  // keys are distinct: exactly one thread owns each round's maximum
    for (int j = 0; j < top_n; ++j) {
      const uint64_t mine = head < kTop ? cand[threadIdx.x][head] : 0;
      const uint64_t b = BlockMax<kSegThreads>(mine, scratch);
      if (b != 0 && mine == b) ++head;
      if (threadIdx.x == 0) out[j] = b;
    }
  }
}

__global__ void __launch_bounds__(kThreads)
    SampleKernel(const float* __restrict__ logits, int vocab, const SamplingRow* __restrict__ params,
                 const Partial* __restrict__ partials, const uint64_t* __restrict__ tops,
                 int segments, bool seg_top, int32_t* __restrict__ tokens,
                 float* __restrict__ logprobs, int top_n,
                 int32_t* __restrict__ top_ids, float* __restrict__ top_logprobs) {
  __shared__ Shared sh;
  const int r = blockIdx.x;
  const float* row = logits + static_cast<size_t>(r) * vocab;
  const bool vec = (reinterpret_cast<uintptr_t>(row) & 15) == 0;
  const SamplingRow prm = params[r];

  // Merge the segments of pass 1.
  MaxSum ms{-INFINITY, 0.0f, INT_MAX};
  KeyMax raced{-INFINITY, INT_MAX};
  for (int j = threadIdx.x; j < segments; j += kThreads) {
    const Partial p = partials[static_cast<size_t>(r) * segments + j];
    ms = Merge(ms, p.ms);
    raced = KeyMaxOp()(raced, p.race);
  }
  ms = ReduceMs(sh.cub.reduce_ms).Reduce(ms, MergeOp());
  __syncthreads();
  raced = ReduceKm(sh.cub.reduce_km).Reduce(raced, KeyMaxOp());
  if (threadIdx.x == 0) {
    sh.stats = ms;
    sh.token = raced.id;
  }
  __syncthreads();
  ms = sh.stats;
  const int raced_id = sh.token;
  __syncthreads();
  const float lse = ms.m + logf(ms.s);

  if (top_n > 0 && seg_top) {
    // The row's top_n among the segments' (at most kSegTop each, 0 = none).
    __shared__ uint64_t scratch[kThreads / 32];
    const uint64_t* cand = tops + static_cast<size_t>(r) * segments * kSegTop;
    const int n_cand = segments * kSegTop;
    uint64_t prev = ~0ull;
    for (int j = 0; j < top_n; ++j) {
      uint64_t mine = 0;
      for (int c = threadIdx.x; c < n_cand; c += kThreads) {
        if (c % kSegTop >= top_n) continue;
        const uint64_t k = cand[c];
        if (k < prev && k > mine) mine = k;
      }
      const uint64_t b = BlockMax<kThreads>(mine, scratch);
      prev = b;
      if (threadIdx.x == 0) {
        const int id = b != 0 ? static_cast<int>(~static_cast<uint32_t>(b)) : ms.arg;
        top_ids[static_cast<size_t>(r) * top_n + j] = id;
        top_logprobs[static_cast<size_t>(r) * top_n + j] = row[id] - lse;
      }
    }
  } else if (top_n > 0) {
    const uint64_t kappa = RadixSelect<false>(
        row, vocab, vec, 0, static_cast<double>(top_n),
        [](int i, float v) { return RawKey(v, i); }, [](int, float) { return 1.0f; }, sh);
    if (threadIdx.x == 0) sh.n_top = 0;
    __syncthreads();
    ForEach(row, vocab, vec, [&](int i, float v) {
      const uint64_t k = RawKey(v, i);
      if (k >= kappa) {
        const int slot = atomicAdd(&sh.n_top, 1);
        if (slot < kMaxTopN) {
          sh.top_key[slot] = k;
          sh.top_id[slot] = i;
        }
      }
    });
    __syncthreads();
    if (threadIdx.x == 0) {
      const int n = min(sh.n_top, kMaxTopN);
      for (int a = 1; a < n; ++a) {  // insertion sort, largest key first
        const uint64_t k = sh.top_key[a];
        const int id = sh.top_id[a];
        int b = a - 1;
        while (b >= 0 && sh.top_key[b] < k) {
          sh.top_key[b + 1] = sh.top_key[b];
          sh.top_id[b + 1] = sh.top_id[b];
          --b;
        }
        sh.top_key[b + 1] = k;
        sh.top_id[b + 1] = id;
      }
      for (int j = 0; j < top_n; ++j) {
        const int id = j < n ? sh.top_id[j] : ms.arg;
        top_ids[static_cast<size_t>(r) * top_n + j] = id;
        top_logprobs[static_cast<size_t>(r) * top_n + j] = row[id] - lse;
      }
    }
    __syncthreads();
  }

  int token = ms.arg;
  if (prm.temperature > 0.0f && ms.m != -INFINITY && Unfiltered(prm, vocab)) {
    if (raced_id != INT_MAX) token = raced_id;
  } else if (prm.temperature > 0.0f && ms.m != -INFINITY) {
    const float inv_t = 1.0f / prm.temperature;
    const float mt = __fmul_rn(ms.m, inv_t);
    // As the CPU: v * inv_t rounded, then the max subtracted (no FMA).
    auto p_key = [=](int i, float v) { return PKey(expf(__fmul_rn(v, inv_t) - mt), i); };
    auto p_weight = [=](int, float v) { return expf(__fmul_rn(v, inv_t) - mt); };
    uint64_t floor = 0;
    if (prm.top_k > 0 && prm.top_k < vocab) {
      floor = RadixSelect<false>(row, vocab, vec, 0, static_cast<double>(prm.top_k), p_key,
                                 p_weight, sh);
    }
    if (prm.top_p < 1.0f) {
      floor = RadixSelect<true>(row, vocab, vec, floor, static_cast<double>(prm.top_p), p_key,
                                p_weight, sh);
    }
    if (prm.min_p > 0.0f) {
      const uint64_t mk = static_cast<uint64_t>(__float_as_uint(prm.min_p)) << 32;
      if (mk > floor) floor = mk;
    }
    Race rc(prm);
    KeyMax best{-INFINITY, INT_MAX};
    ForEach(row, vocab, vec, [&](int i, float v) {
      if (floor != 0 && p_key(i, v) < floor) return;
      Offer(best, rc.Score(i, v), i);
    });
    best = ReduceKm(sh.cub.reduce_km).Reduce(best, KeyMaxOp());
    if (threadIdx.x == 0) sh.token = best.id == INT_MAX ? ms.arg : best.id;
    __syncthreads();
    token = sh.token;
  }
  if (threadIdx.x == 0) {
    tokens[r] = token;
    if (logprobs != nullptr) logprobs[r] = row[token] - lse;
  }
}

}  // namespace

size_t SampleWorkspaceBytes(int rows, int vocab) {
  if (rows <= 0 || vocab <= 0) return 0;
  // rows x segments per row is not monotonic in rows (fewer rows, more
  // segments each): size for the largest count of any smaller step.
  size_t n = 0;
  for (int r = 1; r <= rows; ++r) n = std::max(n, static_cast<size_t>(r) * Segments(r, vocab));
  return (n * sizeof(Partial) + 15) / 16 * 16 + n * kSegTop * sizeof(uint64_t);
}

cudaError_t LaunchSample(const float* logits, int rows, int vocab, const SamplingRow* params,
                         int32_t* tokens, float* logprobs, int top_n, int32_t* top_ids,
                         float* top_logprobs, void* workspace, size_t workspace_bytes,
                         cudaStream_t stream) {
  if (logits == nullptr || params == nullptr || tokens == nullptr || rows < 0 || vocab <= 0 ||
      top_n < 0 || top_n > kMaxTopN || top_n > vocab ||
      (top_n > 0 && (top_ids == nullptr || top_logprobs == nullptr))) {
    return cudaErrorInvalidValue;
  }
  if (rows == 0) return cudaSuccess;
  if (workspace == nullptr || workspace_bytes < SampleWorkspaceBytes(rows, vocab) ||
      rows > 65535) {
    return cudaErrorInvalidValue;
  }
  const int segments = Segments(rows, vocab);
  const size_t n = static_cast<size_t>(rows) * segments;
  auto* partials = static_cast<Partial*>(workspace);
  auto* tops = reinterpret_cast<uint64_t*>(static_cast<char*>(workspace) +
                                           (n * sizeof(Partial) + 15) / 16 * 16);
  const dim3 grid(segments, rows);
  const int seg_len = (((vocab + segments - 1) / segments) + 3) & ~3;
  const bool seg_top = top_n > 0 && top_n <= kSegTop && seg_len <= kSegTopMaxLen;
  if (seg_top) {
    SegmentKernel<kSegTop><<<grid, kSegThreads, 0, stream>>>(logits, vocab, segments, params,
                                                             top_n, partials, tops);
  } else {
    SegmentKernel<0><<<grid, kSegThreads, 0, stream>>>(logits, vocab, segments, params, 0,
                                                       partials, tops);
  }
  SampleKernel<<<rows, kThreads, 0, stream>>>(logits, vocab, params, partials, tops, segments,
                                              seg_top, tokens, logprobs, top_n, top_ids,
                                              top_logprobs);
  return cudaGetLastError();
}

// Asking for a kernel's attributes loads it (under lazy module loading a
// kernel is otherwise loaded at its first launch, which may wait for the
// device: fatal behind a kernel that waits for the host).
cudaError_t LoadSamplingKernels() {
  cudaFuncAttributes a;
  for (cudaError_t err :
       {cudaFuncGetAttributes(&a, SegmentKernel<kSegTop>),
        cudaFuncGetAttributes(&a, SegmentKernel<0>), cudaFuncGetAttributes(&a, SampleKernel),
        LoadAdjustKernels(), LoadMaskKernels()}) {
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

}  // namespace flotilla::kernels::cuda
