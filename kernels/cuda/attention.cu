// gpt-oss attention with sinks over the paged KV cache (attention.h).
//
// One kernel serves both shapes. A CTA (4 warps) owns one sequence b, one kv
// head g and a block of "rows", a row being one (query token, q head of the
// group of g) pair: all q heads sharing a kv head sit in the same CTA, so each
// K/V tile is read from memory once for all of them. Rows are ordered query
// major, head minor (row = i * group + hh). The CTA walks its key range in
// tiles of 64 keys (aligned to multiples of 64 positions), loaded with 16-byte
// cp.async into a shared-memory ring of 3 or 5 stages (zero-filled outside the
// range the rows need, so freed blocks before a sliding window are never
// read), and runs Q K^T and P V on tensor cores (mma.sync m16n8k16, bf16 in, f32 accumulate;
// prefill CTAs over a bf16 cache on warpgroup MMA, wgmma m64n64k16, instead: WG below)
// with an online softmax in f32 (log2 domain).
//
// Warp layout, RG = row groups per CTA, MR = 16-row tiles per warp (template):
//   RG = 4, MR = 2 (prefill): 128 rows per CTA; every warp owns 32 rows and all
//          64 keys of each tile (each K/V fragment feeds two mma row tiles).
//          Grid x = row blocks (longest first), no KV split.
//   RG = 4, MR = 1 (prefill of windowed layers and short sequences): the
//          same with 16 rows per warp, 64 per CTA, 3 CTAs per SM.
//   RG = 1 or 2, MR = 1 (decode: max_q_per_seq * group <= 32, up to 4 tokens per
//          sequence for gpt-oss): 16 or 32 rows; the 4 warps split each tile's
//          keys (16 or 32 each) and are merged through shared memory at the
//          end. Grid x = KV splits (flash-decoding): the key range is cut in
//          chunks of whole tiles; the split count and chunk size come from host
//          fields only (max_seq_len, max_q_per_seq, window, batch, kv heads, SM
//          count), so the launch captures into a CUDA graph; splits beyond a
//          sequence's actual range exit at once. Two shapes: "wide" (small
//          batches, batch * kv_heads <= 2 * SMs) runs 2 CTAs per SM with a
//          5-deep ring (128 KB in flight per SM) and 2 * SMs / (batch *
//          kv_heads) splits, so every SM streams; otherwise 4 CTAs per SM with
//          a 3-deep ring and at most one wave. With more than one split, each
//          split writes its partial (max, sum, acc) to the workspace and bumps
//          an arrival counter of its (sequence, kv head); the last CTA to
//          arrive merges the partials with the sink, writes the output and
//          resets the counter to zero (no second kernel). That merge code is
//          compiled only into the multi-split kernels (FUSED): merely present,
//          it cost the single-split kernels about 5% (register allocation).
// The sink enters only at the final normalisation: out = acc * e^(m - M) /
// (l * e^(m - M) + e^(sink - M)), M = max(m, sink).
//
// FP8 layers (KV8): the ring holds e4m3 codes and scales. Decode CTAs turn
// the codes straight into f16 mma fragments (kDirect), prefill CTAs convert
// each tile into an f16 tile first (f16 mma); the scales multiply the scores and the
// probabilities in registers (attention_fp8.cuh). The bf16 kernels are
// compiled from the same code without any of it.
#include <cuda_bf16.h>

#include <algorithm>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/attention_fp8.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/ptx.cuh"

namespace flotilla::kernels::cuda {
namespace {
using ptx::CpAsync16;
using ptx::CpAsyncCommit;
using ptx::CpAsyncWait;
using ptx::LdMatrixX4;
using ptx::LdMatrixX4Trans;
using ptx::MmaBf16;
using ptx::MmaF16;

constexpr int kD = 64;         // head_dim (the only one supported)
constexpr int kTile = 64;      // keys per pipeline stage
constexpr int kThreads = 128;  // 4 warps
// Shared-memory ring depth: 3 tiles (2 in flight while one is used) for CTAs
// of 16 rows that fit 4 per SM (50 KB shared, <= 128 registers), so one wave
// streams 8 tiles (128 KB) per SM; a deeper ring with 3 CTAs per SM measured
// slower at batch 64 (1.3 waves of CTAs). The wide decode shape (2 CTAs per
// SM, 84 KB of shared memory each, so never 3) uses a 5-deep ring instead.
constexpr int kStages = 3;
constexpr int kWideStages = 5;
// FP8 layers: a stage holds half the bytes, so the ring is deeper (4 stages
// at 4 CTAs per SM). They never take the wide shape: their decode is
// issue-bound and wants the 16 warps per SM of 4 CTAs more than a deeper
// ring (H200, batch 16 at 32k context: 253 us per layer wide with 10
// stages, 228 us at 4 CTAs per SM; 6 stages at 4 CTAs per SM no faster).
constexpr int kStages8 = 4;
constexpr int kWideCtasPerSm = 2;
// Whether a kernel of STAGES stages is the wide shape (2 CTAs per SM).
template <int STAGES, bool KV8>
constexpr bool kIsWide = !KV8 && STAGES >= kWideStages;
constexpr int kStageElems = 2 * kTile * kD;  // K then V, bf16 elements (16 KB)
constexpr int kDecodeMaxQ = 4;               // decode path up to this many tokens per sequence
constexpr int kDecodeMaxRows = 32;
constexpr int kPrefillMr = 2;  // prefill: 32 rows per warp, 128 rows per CTA
// ... or 16 rows per warp (64 per CTA, 3 CTAs per SM: more warps, each K/V
// tile shared by half as many rows) where the key ranges are short: windowed
// layers and sequences of at most this many positions (H200, us per layer
// call, 128 / 64 rows: full attention over 2,048 tokens 233 / 214, over
// 8,192 2,171 / 2,317; window 128 over 8,192 tokens 427 / 355).
constexpr int kPrefillNarrowMaxLen = 4096;
// KV-split sizing of the 4-CTAs-per-SM shape: at most one wave of decode CTAs,
// assuming this many kv heads (a heuristic; any count works), and at least a
// few tiles per split so partials and the merge stay small next to the K/V.
constexpr int kDecodeCtasPerSm = 4;
constexpr int kTypicalKvHeads = 8;
constexpr int kMinTilesPerSplit = 3;
constexpr int kWideMinTilesPerSplit = 2;
// Arrival counters (one per sequence and kv head) sit at the start of the
// workspace, a fixed region so that calls of any batch share the layout; a
// call with more (sequence, kv head) pairs than this runs unsplit.
constexpr int kMaxCounters = 8192;
constexpr size_t kCounterBytes = kMaxCounters * sizeof(unsigned);
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kNoMax = -1e30f;  // finite "no key yet" running max

struct Params {
  const uint16_t* q;
  const uint16_t* k;
  const uint16_t* v;
  const uint8_t* k8;  // FP8 layers: codes and scales per block (ops.h)
  const uint8_t* v8;
  long long blk_bytes;  // FP8: bytes between blocks
  int scale_off;        // FP8: the scales' offset in a block
  const int32_t* block_tables;
  const int32_t* seq_lens;
  const int32_t* q_start;
  const float* sinks;
  uint16_t* out;
  float* part_acc;     // [batch, splits, max_q, q_heads, D]
  float* part_ml;      // [batch, splits, max_q, q_heads, 2]
  unsigned* counters;  // [batch, kv_heads] arrivals, zero between calls
  int max_blocks;
  int q_heads, kv_heads, group;
  int block_shift;
  int window;
  float scale_log2;
  int splits;  // KV splits per (sequence, kv head, row block)
  int chunk;   // keys per split, a multiple of kTile
  int max_q;
};

__device__ __forceinline__ uint32_t PackBf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// The sum over a quad's four lanes (the lanes sharing an mma row).
__device__ __forceinline__ float QuadSum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// What a row's sums (max M and sum l of e^(score - M), log2 domain) are
// multiplied by to give its output with the head's sink (in natural log
// units): e^(M - M') / (l e^(M - M') + e^(sink - M')), M' = max(M, sink).
__device__ __forceinline__ float SinkScale(float M, float l, float sink) {
  const float s = sink * kLog2e;
  const float Mf = fmaxf(M, s);
  const float f = exp2f(M - Mf);
  return f / (l * f + exp2f(s - Mf));
}

// Element offset of 16-byte chunk c of row r in a [rows][64] bf16 tile; the
// chunk index is XOR-swizzled with the row so ldmatrix is conflict free.
__device__ __forceinline__ int Swz(int r, int c) { return r * kD + ((c ^ (r & 7)) << 3); }

// FP8 decode (attention_fp8.cuh): the helpers that feed the f16 mma
// straight from a ring stage's codes.
__device__ __forceinline__ float Bf16Lo(uint32_t x) { return __uint_as_float(x << 16); }
__device__ __forceinline__ float Bf16Hi(uint32_t x) { return __uint_as_float(x & 0xffff0000u); }

// f16 pair (lo in the low half), rounded to nearest and clamped to f16's
// finite range in one conversion.
__device__ __forceinline__ uint32_t PackF16Sat(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.satfinite.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// Q rows r and r + 8 of sQ as f16 A fragments in the order of dimensions
// QkFp8 gives a key's codes in: k step j holds dimensions 16 t4 + 4 j +
// {0, 1} (a0, a1) and + {2, 3} (a2, a3).
__device__ __forceinline__ void LoadQF16(const uint16_t* sQ, int r, int t4, uint32_t (&qf)[4][4]) {
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const uint2 u =
          *reinterpret_cast<const uint2*>(sQ + Swz(r + 8 * e, 2 * t4 + (j >> 1)) + 4 * (j & 1));
      qf[j][e] = PackF16Sat(Bf16Lo(u.x), Bf16Hi(u.x));
      qf[j][2 + e] = PackF16Sat(Bf16Lo(u.y), Bf16Hi(u.y));
    }
}

// s (an n-tile of 8 keys; this lane's B column is `key`) += Q K^T in code
// units: the lane's 16 codes of chunk t4 are its B fragments of the four k
// steps.
__device__ __forceinline__ void QkFp8(float (&s)[4], const uint32_t (&qf)[4][4], const uint8_t* stK,
                                      int key, int t4) {
  const uint4 w = *reinterpret_cast<const uint4*>(stK + fp8_tile::CodeOffset(key, t4));
  const uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    uint32_t b0, b1;
    fp8_tile::CodesToF16x2x2(words[j], &b0, &b1);
    MmaF16(s, qf[j], b0, b1);
  }
}

// FP8 layers: the probabilities enter P V as f16 times their key's V scale
// times this (and the sums are divided by it once at the end), so that
// small probabilities of small-valued rows stay f16 normals; satfinite
// clamps rows with values past ~110,000.
constexpr float kPScale = 256.f;

// The 16-bit mma and operand packing of a kernel: f16 for FP8 layers (their
// codes convert to f16 exactly), bf16 otherwise.
template <bool F16>
__device__ __forceinline__ void Mma16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                      uint32_t b1) {
  if constexpr (F16) {
    MmaF16(c, a, b0, b1);
  } else {
    MmaBf16(c, a, b0, b1);
  }
}
template <bool F16>
__device__ __forceinline__ uint32_t Pack16(float lo, float hi) {
  if constexpr (F16) return PackF16Sat(lo, hi);
  return PackBf16(lo, hi);
}

// 2^x, flushing subnormal results to 0 (one instruction).
__device__ __forceinline__ float Exp2Ftz(float x) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(r) : "f"(x));
  return r;
}

// acc += P V in code units over keys kb .. kb + 15 (a: P's A fragment).
// ldmatrix.trans on the codes as byte pairs hands each lane keys 2 t4, 2 t4 +
// 1 (+ 8) of dimensions 16 c + 2 g4 and + 1; one byte permute pairs the two
// keys of each dimension, so n-tile 2 c + parity holds dimensions 16 c + 2 n
// + parity.
__device__ __forceinline__ void PvFp8(float (&acc)[8][4], const uint32_t (&a)[4],
                                      const uint8_t* stV, int kb, int lane) {
  const int m = lane >> 3;
  const int key = kb + (m & 1) * 8 + (lane & 7);
#pragma unroll
  for (int cp = 0; cp < 2; ++cp) {
    uint32_t r[4];
    LdMatrixX4Trans(r, stV + fp8_tile::CodeOffset(key, 2 * cp + (m >> 1)));
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int c = 2 * cp + h;
      uint32_t e0, o0, e1, o1;
      fp8_tile::CodesToF16x2x2(__byte_perm(r[2 * h], 0u, 0x3120), &e0, &o0);
      fp8_tile::CodesToF16x2x2(__byte_perm(r[2 * h + 1], 0u, 0x3120), &e1, &o1);
      MmaF16(acc[2 * c], a, e0, e1);
      MmaF16(acc[2 * c + 1], a, o0, o1);
    }
  }
}

// Key range [lo, hi] the rows of a row block need, for sequence length L with
// n new tokens; hi < lo when there is none.
struct KeyRange {
  int lo, hi;
};
__device__ __forceinline__ KeyRange RowBlockKeys(int L, int n, int i_first, int i_last,
                                                 int window) {
  const int p_first = L - n + i_first;
  const int p_last = L - n + i_last;
  KeyRange kr;
  kr.lo = window > 0 ? max(0, p_first - window + 1) : 0;
  kr.hi = p_last;
  return kr;
}

// Arrival of a split CTA whose partial is written: the partial is made visible
// device-wide before the counter moves; the CTA that brings the count to ns
// merges (and resets the counter for the next call, which is stream-ordered
// after this grid).
template <bool WIDE>
__device__ __forceinline__ void MergeSplits(const Params& p, float* flag_smem, int b, int g, int qs,
                                            int rows_total, int ns) {
  const int tid = threadIdx.x;
  int& is_last = *reinterpret_cast<int*>(flag_smem);  // past the reduction buffers
  __threadfence();
  __syncthreads();
  if (tid == 0) {
    unsigned* counter = p.counters + b * p.kv_heads + g;
    const bool last = atomicAdd(counter, 1u) + 1u == static_cast<unsigned>(ns);
    if (last) *counter = 0u;
    is_last = last;
  }
  __syncthreads();
  if (!is_last) return;
  __threadfence();
  // Merge: a thread per (row, 4 dims), an online rescaling over the splits with
  // 8 or 16 splits' loads in flight (L2, bypassing L1: other SMs wrote them).
  // The sink starts the running max and sum (e^(sink - sink) = 1).
  const size_t split_stride = static_cast<size_t>(p.max_q) * p.q_heads;  // slots between splits
  const float2* part_ml2 = reinterpret_cast<const float2*>(p.part_ml);
  const float4* part_acc4 = reinterpret_cast<const float4*>(p.part_acc);
  for (int item = tid; item < rows_total * (kD / 4); item += kThreads) {
    const int row = item / (kD / 4), c4 = item % (kD / 4);
    const int i = row / p.group;
    const int h = g * p.group + row % p.group;
    const size_t slot0 = ((static_cast<size_t>(b) * p.splits) * p.max_q + i) * p.q_heads + h;
    float M = p.sinks[h] * kLog2e, l = 1.f;
    float4 a = make_float4(0.f, 0.f, 0.f, 0.f);
    // Splits whose partials the merging CTA loads at once (8 where registers
    // are capped at 128 for 4 CTAs per SM).
    constexpr int kMergeBatch = WIDE ? 16 : 8;
    for (int s0 = 0; s0 < ns; s0 += kMergeBatch) {
      float2 ml[kMergeBatch];
      float4 av[kMergeBatch];
#pragma unroll
      for (int u = 0; u < kMergeBatch; ++u) {
        ml[u] = make_float2(kNoMax, 0.f);
        av[u] = make_float4(0.f, 0.f, 0.f, 0.f);
        if (s0 + u < ns) {
          const size_t slot = slot0 + (s0 + u) * split_stride;
          ml[u] = __ldcg(part_ml2 + slot);
          av[u] = __ldcg(part_acc4 + slot * (kD / 4) + c4);
        }
      }
#pragma unroll
      for (int u = 0; u < kMergeBatch; ++u) {
        const float Mn = fmaxf(M, ml[u].x);
        const float fo = exp2f(M - Mn), fn = exp2f(ml[u].x - Mn);
        M = Mn;
        l = l * fo + ml[u].y * fn;
        a.x = a.x * fo + av[u].x * fn;
        a.y = a.y * fo + av[u].y * fn;
        a.z = a.z * fo + av[u].z * fn;
        a.w = a.w * fo + av[u].w * fn;
      }
    }
    const float inv_l = 1.f / l;
    uint2 o;
    o.x = PackBf16(a.x * inv_l, a.y * inv_l);
    o.y = PackBf16(a.z * inv_l, a.w * inv_l);
    *reinterpret_cast<uint2*>(p.out + (static_cast<size_t>(qs + i) * p.q_heads + h) * kD + c4 * 4) =
        o;
  }
}

// FUSED: the grid has more than one KV split (write partials, count arrivals,
// merge in the last CTA); without it the merge code is not compiled in.
// WG (bf16 prefill only): Q K^T and P V on warpgroup MMA (wgmma), the CTA's
// four warps one warpgroup, K and V read by the tensor cores straight from
// the ring (K as a K-major operand, V as an MN-major one: the ring's swizzle
// is wgmma's 128-byte swizzle); row tile mr of warp w is then tile 4 mr + w
// (64 rows per wgmma), not MR w + mr.
template <int RG, int MR, int STAGES, bool FUSED, bool KV8, bool WG = false>
__global__ void __launch_bounds__(kThreads, kIsWide<STAGES, KV8>
                                                ? kWideCtasPerSm
                                                : (MR == 2 ? 2 : (RG == 1 ? 4 : 3)))
    AttentionKernel(Params p) {
  static_assert(!WG || (RG == 4 && !KV8 && !FUSED), "wgmma: bf16 prefill CTAs only");
  // FP8 decode: codes straight into f16 mma fragments (no converted tile).
  constexpr bool kDirect = KV8 && MR == 1;
  // ... and, with one row group, each warp copies the 16 keys of each tile
  // it uses itself, so a warp barrier orders a stage's copies and reads.
  constexpr bool kWarpCopies = kDirect && RG == 1;
  constexpr int kRows = 16 * RG * MR;  // MR row tiles of 16 per warp
  constexpr int kKs = 4 / RG;          // warps sharing one row group (splitting keys)
  constexpr int kKn = kTile / kKs;     // keys per warp per tile
  constexpr int kNt = kKn / 8;         // n-tiles of S per warp
  extern __shared__ uint4 smem_raw[];
  uint8_t* smem_base = reinterpret_cast<uint8_t*>(smem_raw);
  // WG: the stages 1024-byte aligned (SmemBytes leaves the slack).
  if constexpr (WG) smem_base += (1024u - (ptx::SharedAddress(smem_raw) & 1023u)) & 1023u;
  uint16_t* sQ = reinterpret_cast<uint16_t*>(smem_base);
  uint16_t* sKV = sQ + kRows * kD;  // the ring (KV8: of codes and scales)
  // KV8 prefill: the tile in use as f16 (K then V) and its f32 scales.
  uint16_t* sKVb =
      reinterpret_cast<uint16_t*>(reinterpret_cast<uint8_t*>(sKV) + STAGES * fp8_tile::kStageBytes);
  float* sScale = reinterpret_cast<float*>(sKVb + kStageElems);

  // Launched programmatically dependent on the previous kernel of the stream
  // (which writes q and the new K/V): wait for its results before reading
  // anything; a no-op after an ordinary launch. Then let the next kernel of the
  // stream be scheduled once every CTA of this grid has started (it still
  // waits for this grid's results).
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
  const int tid = threadIdx.x;
  const int warp = tid >> 5, lane = tid & 31;
  const int split = blockIdx.x % p.splits;
  const int rb = (gridDim.x / p.splits) - 1 - blockIdx.x / p.splits;  // longest first
  const int g = blockIdx.y;
  const int b = blockIdx.z;

  const int L = p.seq_lens[b];
  const int qs = p.q_start[b];
  const int n = p.q_start[b + 1] - qs;
  const int rows_total = n * p.group;
  const int row0 = rb * kRows;
  if (row0 >= rows_total) return;
  const int i_first = row0 / p.group;
  const int i_last = (min(row0 + kRows, rows_total) - 1) / p.group;
  const KeyRange kr = RowBlockKeys(L, n, i_first, i_last, p.window);
  const int tile_lo = kr.lo & ~(kTile - 1);
  const int start = tile_lo + split * p.chunk;
  if (split > 0 && start > kr.hi) return;
  const int end = min(start + p.chunk, kr.hi + 1);
  const int ntiles = end > start ? (end - start + kTile - 1) / kTile : 0;

  // Q rows (zero for rows past the last query).
  for (int idx = tid; idx < kRows * 8; idx += kThreads) {
    const int r = idx >> 3, c = idx & 7;
    const int row = row0 + r;
    const bool valid = row < rows_total;
    const int i = valid ? row / p.group : 0;
    const int h = g * p.group + (valid ? row % p.group : 0);
    const uint16_t* src = p.q + (static_cast<size_t>(qs + i) * p.q_heads + h) * kD + c * 8;
    CpAsync16(sQ + Swz(r, c), src, valid ? 16 : 0);
  }

  const int block_size_mask = (1 << p.block_shift) - 1;
  const int32_t* table = p.block_tables + static_cast<size_t>(b) * p.max_blocks;
  // Each thread copies chunk c of keys kq, kq + 16, kq + 32, kq + 48 of a tile,
  // for K and for V. The block-table entries of a tile are fetched one load
  // ahead of its copies, so a table read never stalls the issue of a tile.
  // KV8: chunk c8 of keys k8row and k8row + 32 (nb[0], nb[1]); threads
  // 0..15 also copy the scales of keys 8 * (tid & 7) .. + 7 (nb[2]).
  // kWarpCopies: chunk c8 of the warp's keys 16 warp + (lane >> 2) and + 8
  // (nb[0], nb[1]); lanes 0..3 also copy the K and V scales of its keys.
  const int kq = tid >> 3, cc = tid & 7;
  const int k8row = kWarpCopies ? warp * 16 + (lane >> 2) : tid >> 2, c8 = tid & 3;
  auto fetch_blocks = [&](int t, int(&nb)[4]) {
    if constexpr (kWarpCopies) {
      // Blocks of >= 16 positions hold the warp's 16 keys in one block.
      const int j = start + t * kTile + k8row;
      if (p.block_shift >= 4) {
        nb[0] = nb[1] = __ldg(table + min(j >> p.block_shift, p.max_blocks - 1));
        return;
      }
      nb[0] = __ldg(table + min(j >> p.block_shift, p.max_blocks - 1));
      nb[1] = __ldg(table + min((j + 8) >> p.block_shift, p.max_blocks - 1));
      return;
    }
    if constexpr (KV8) {
      const int base = start + t * kTile;
      nb[0] = __ldg(table + min((base + k8row) >> p.block_shift, p.max_blocks - 1));
      nb[1] = __ldg(table + min((base + k8row + 32) >> p.block_shift, p.max_blocks - 1));
      nb[2] = __ldg(table + min((base + 8 * (tid & 7)) >> p.block_shift, p.max_blocks - 1));
      return;
    }
    const int base = start + t * kTile + kq;
#pragma unroll
    for (int u = 0; u < 4; ++u)
      nb[u] = __ldg(table + min((base + 16 * u) >> p.block_shift, p.max_blocks - 1));
  };
  auto issue_fp8_warp = [&](int t, const int(&nb)[4]) {
    uint8_t* st = reinterpret_cast<uint8_t*>(sKV) + (t % STAGES) * fp8_tile::kStageBytes;
    const int first = start + t * kTile + warp * 16;  // the warp's first key
    const bool inside = first >= kr.lo && first + 15 <= kr.hi;
    const size_t head = static_cast<size_t>(g) << p.block_shift;
    if (inside && p.block_shift >= 4) {
      // One block holds the 16 keys: 1 KB of K codes and 1 KB of V codes,
      // whose 16-byte chunk `lane` (+ 32) is chunk c8 of key k8row (+ 8).
      const size_t at = static_cast<size_t>(nb[0]) * p.blk_bytes +
                        (head + (first & block_size_mask)) * kD + lane * 16;
      const int d0 = fp8_tile::CodeOffset(k8row, c8), d1 = fp8_tile::CodeOffset(k8row + 8, c8);
      CpAsync16(st + d0, p.k8 + at, 16);
      CpAsync16(st + d1, p.k8 + at + 512, 16);
      CpAsync16(st + fp8_tile::kCodeBytes + d0, p.v8 + at, 16);
      CpAsync16(st + fp8_tile::kCodeBytes + d1, p.v8 + at + 512, 16);
      if (lane < 4) {
        const size_t sat = static_cast<size_t>(nb[0]) * p.blk_bytes + p.scale_off +
                           (head + (first & block_size_mask)) * sizeof(uint16_t) + (lane & 1) * 16;
        CpAsync16(st + 2 * fp8_tile::kCodeBytes + (lane >> 1) * fp8_tile::kScaleBytes +
                      (warp * 16 + 8 * (lane & 1)) * sizeof(uint16_t),
                  (lane < 2 ? p.k8 : p.v8) + sat, 16);
      }
      return;
    }
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int key = k8row + 8 * u;
      const int j = first - warp * 16 + key;
      const bool valid = inside || (j >= kr.lo && j <= kr.hi && nb[u] >= 0);
      const size_t off = static_cast<size_t>(valid ? nb[u] : 0) * p.blk_bytes +
                         (head + (j & block_size_mask)) * kD + c8 * 16;
      const int at = fp8_tile::CodeOffset(key, c8);
      CpAsync16(st + at, valid ? p.k8 + off : p.k8, valid ? 16 : 0);
      CpAsync16(st + fp8_tile::kCodeBytes + at, valid ? p.v8 + off : p.v8, valid ? 16 : 0);
    }
    if (lane < 4) {
      const int half = lane & 1, j0 = first + 8 * half;
      const int blk = half ? nb[1] : nb[0];  // (no dynamic index: nb stays in registers)
      const bool valid = blk >= 0 && j0 <= kr.hi && j0 + 7 >= kr.lo;
      const uint8_t* src = lane < 2 ? p.k8 : p.v8;
      const size_t off = static_cast<size_t>(valid ? blk : 0) * p.blk_bytes + p.scale_off +
                         (head + (j0 & block_size_mask)) * sizeof(uint16_t);
      CpAsync16(st + 2 * fp8_tile::kCodeBytes + (lane >> 1) * fp8_tile::kScaleBytes +
                    (warp * 16 + 8 * half) * sizeof(uint16_t),
                valid ? src + off : src, valid ? 16 : 0);
    }
  };
  auto issue_fp8_tile = [&](int t, const int(&nb)[4]) {
    if constexpr (kWarpCopies) {
      issue_fp8_warp(t, nb);
      return;
    }
    uint8_t* st = reinterpret_cast<uint8_t*>(sKV) + (t % STAGES) * fp8_tile::kStageBytes;
    const int base = start + t * kTile;
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int key = k8row + 32 * u;
      const int j = base + key;
      const bool valid = j >= kr.lo && j <= kr.hi && nb[u] >= 0;
      const size_t off = static_cast<size_t>(valid ? nb[u] : 0) * p.blk_bytes +
                         ((static_cast<size_t>(g) << p.block_shift) + (j & block_size_mask)) * kD +
                         c8 * 16;
      const int at = fp8_tile::CodeOffset(key, c8);
      CpAsync16(st + at, valid ? p.k8 + off : p.k8, valid ? 16 : 0);
      CpAsync16(st + fp8_tile::kCodeBytes + at, valid ? p.v8 + off : p.v8, valid ? 16 : 0);
    }
    if (tid < 16) {
      const int j0 = base + 8 * (tid & 7);
      const bool valid = nb[2] >= 0 && j0 <= kr.hi && j0 + 7 >= kr.lo;
      const uint8_t* src = tid < 8 ? p.k8 : p.v8;
      const size_t off =
          static_cast<size_t>(valid ? nb[2] : 0) * p.blk_bytes + p.scale_off +
          ((static_cast<size_t>(g) << p.block_shift) + (j0 & block_size_mask)) * sizeof(uint16_t);
      CpAsync16(st + 2 * fp8_tile::kCodeBytes + (tid >> 3) * fp8_tile::kScaleBytes + (tid & 7) * 16,
                valid ? src + off : src, valid ? 16 : 0);
    }
  };
  // KV8 prefill (not kDirect): the codes of tile t into the f16 tile and its
  // scales into f32 (V's times kPScale), by the whole CTA.
  auto convert_fp8_tile = [&](int t) {
    const uint8_t* st =
        reinterpret_cast<const uint8_t*>(sKV) + (t % STAGES) * fp8_tile::kStageBytes;
#pragma unroll
    for (int idx = tid; idx < 2 * kTile * 4; idx += kThreads) {
      const int kv = idx / (kTile * 4), key = (idx >> 2) % kTile, c = idx & 3;
      const uint4 w = *reinterpret_cast<const uint4*>(st + kv * fp8_tile::kCodeBytes +
                                                      fp8_tile::CodeOffset(key, c));
      uint4 lo, hi;
      fp8_tile::CodesToF16x16(w, &lo, &hi);
      uint16_t* dst = sKVb + kv * kTile * kD;
      *reinterpret_cast<uint4*>(dst + Swz(key, 2 * c)) = lo;
      *reinterpret_cast<uint4*>(dst + Swz(key, 2 * c + 1)) = hi;
    }
    if (tid >= 2 * kTile) return;
    const int key = tid % kTile, kv = tid / kTile;
    const int j = start + t * kTile + key;
    const uint16_t raw = *reinterpret_cast<const uint16_t*>(
        st + 2 * fp8_tile::kCodeBytes + kv * fp8_tile::kScaleBytes + key * sizeof(uint16_t));
    sScale[kv * kTile + key] = j >= kr.lo && j <= kr.hi ? (kv ? kPScale : 1.f) * Bf16Lo(raw) : 0.f;
  };
  auto issue_tile = [&](int t, const int(&nb)[4]) {
    if constexpr (KV8) {
      issue_fp8_tile(t, nb);
      return;
    }
    uint16_t* st = sKV + (t % STAGES) * kStageElems;
    const int base = start + t * kTile;
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int key = kq + 16 * u;
      const int j = base + key;
      const bool valid = j >= kr.lo && j <= kr.hi && nb[u] >= 0;
      const size_t off =
          ((((static_cast<size_t>(valid ? nb[u] : 0) * p.kv_heads + g) << p.block_shift) +
            (j & block_size_mask)) *
           kD) +
          cc * 8;
      CpAsync16(st + Swz(key, cc), valid ? p.k + off : p.k, valid ? 16 : 0);
      CpAsync16(st + kTile * kD + Swz(key, cc), valid ? p.v + off : p.v, valid ? 16 : 0);
    }
  };

  {
    int nb0[STAGES - 1][4];
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s)
      if (s < ntiles) fetch_blocks(s, nb0[s]);
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
      if (s < ntiles) issue_tile(s, nb0[s]);
      CpAsyncCommit();
    }
  }
  int nb_next[4] = {0, 0, 0, 0};  // table entries of tile STAGES - 1 + t at iteration t
  if (STAGES - 1 < ntiles) fetch_blocks(STAGES - 1, nb_next);

  // This thread's rows: g4 and g4 + 8 of each of its warp's MR row tiles.
  const int rg = warp % RG;
  const int kslot = warp / RG;
  const int g4 = lane >> 2, t4 = lane & 3;
  // The CTA's 16-row tile that is this warp's row tile mr.
  const auto tile_of = [&](int mr) { return WG ? mr * 4 + warp : rg * MR + mr; };
  int pos_r[MR][2], lo_r[MR][2];
#pragma unroll
  for (int mr = 0; mr < MR; ++mr)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int row = row0 + tile_of(mr) * 16 + g4 + e * 8;
      if (row < rows_total) {
        pos_r[mr][e] = L - n + row / p.group;
        lo_r[mr][e] = p.window > 0 ? max(0, pos_r[mr][e] - p.window + 1) : 0;
      } else {
        pos_r[mr][e] = -1;
        lo_r[mr][e] = 0;
      }
    }

  // Keys every row of the CTA sees: tiles inside [lo_all, pos_all] need no mask.
  const bool all_rows = row0 + kRows <= rows_total;
  const int pos_all = L - n + i_first;
  const int lo_all = p.window > 0 ? max(0, L - n + i_last - p.window + 1) : 0;

  float m_run[MR][2], l_run[MR][2];
  float acc[MR][8][4];
#pragma unroll
  for (int mr = 0; mr < MR; ++mr) {
    m_run[mr][0] = m_run[mr][1] = kNoMax;
    l_run[mr][0] = l_run[mr][1] = 0.f;
#pragma unroll
    for (int nd = 0; nd < 8; ++nd)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mr][nd][e] = 0.f;
  }
  uint32_t qf[MR][4][4];

  for (int t = 0; t < ntiles; ++t) {
    CpAsyncWait<STAGES - 2>();
    // WG: the stage was written through the generic proxy; wgmma reads it
    // through the async proxy.
    if constexpr (WG) asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    if (kWarpCopies && t > 0) {
      __syncwarp();
    } else {
      __syncthreads();  // (kWarpCopies: the Q rows, copied by every warp)
    }
    if (t + STAGES - 1 < ntiles) {
      issue_tile(t + STAGES - 1, nb_next);
      if (t + STAGES < ntiles) fetch_blocks(t + STAGES, nb_next);
    }
    CpAsyncCommit();
    if (t == 0 && !WG) {
      if constexpr (kDirect) {
        LoadQF16(sQ, rg * 16 + g4, t4, qf[0]);
      } else {
        if constexpr (KV8) {  // Q to f16 in place (the FP8 tiles are f16)
          for (int idx = tid; idx < kRows * 8; idx += kThreads) {
            uint4* q8 = reinterpret_cast<uint4*>(sQ) + idx;
            const uint4 u = *q8;
            *q8 = make_uint4(
                PackF16Sat(Bf16Lo(u.x), Bf16Hi(u.x)), PackF16Sat(Bf16Lo(u.y), Bf16Hi(u.y)),
                PackF16Sat(Bf16Lo(u.z), Bf16Hi(u.z)), PackF16Sat(Bf16Lo(u.w), Bf16Hi(u.w)));
          }
          __syncthreads();
        }
#pragma unroll
        for (int mr = 0; mr < MR; ++mr)
#pragma unroll
          for (int kk = 0; kk < 4; ++kk) {
            const int r = tile_of(mr) * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
            LdMatrixX4(qf[mr][kk], sQ + Swz(r, 2 * kk + (lane >> 4)));
          }
      }
    }
    if constexpr (KV8 && !kDirect) {
      convert_fp8_tile(t);
      __syncthreads();
    }
    const uint16_t* sK = KV8 ? sKVb : sKV + (t % STAGES) * kStageElems;
    const uint16_t* sV = sK + kTile * kD;
    // kDirect: the stage's codes and scales (K then V).
    const uint8_t* stK =
        reinterpret_cast<const uint8_t*>(sKV) + (t % STAGES) * fp8_tile::kStageBytes;
    const uint8_t* stV = stK + fp8_tile::kCodeBytes;
    const uint8_t* stS = stV + fp8_tile::kCodeBytes;
    const int ko = kslot * kKn;
    const int base = start + t * kTile + ko;

    float s[MR][kNt][4];
    if constexpr (WG) {
      // Q's fragments are loaded again for every tile: kept in registers
      // across tiles, ptxas gave their registers to P's fragments of the
      // P V wgmmas (found on an H200: every row block of more than one tile
      // was wrong). The first k step overwrites the scores (no zeroing).
      uint32_t qw[MR][4][4];
#pragma unroll
      for (int mr = 0; mr < MR; ++mr)
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
          const int r = tile_of(mr) * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
          LdMatrixX4(qw[mr][kk], sQ + Swz(r, 2 * kk + (lane >> 4)));
          ptx::FenceWgmmaFragment(qw[mr][kk]);
        }
      const uint64_t desc_k = ptx::SmemDescSw128(sK);
      ptx::WgmmaFence();
#pragma unroll
      for (int mr = 0; mr < MR; ++mr)
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
          ptx::WgmmaBf16N64<0>(s[mr], qw[mr][kk], desc_k + 2 * kk, kk > 0);  // +32 bytes
      ptx::WgmmaCommit();
      ptx::WgmmaWaitAll();
#pragma unroll
      for (int mr = 0; mr < MR; ++mr) {
        ptx::FenceWgmmaTile(s[mr]);
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) ptx::FenceWgmmaFragment(qw[mr][kk]);
      }
    }
#pragma unroll
    for (int nt = 0; nt < (WG ? 0 : kNt); ++nt) {
#pragma unroll
      for (int mr = 0; mr < MR; ++mr)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[mr][nt][e] = 0.f;
      if constexpr (kDirect) {
        QkFp8(s[0][nt], qf[0], stK, ko + nt * 8 + g4, t4);
      } else {
#pragma unroll
        for (int pr = 0; pr < 2; ++pr) {
          uint32_t bk[4];
          const int key = ko + nt * 8 + (lane & 7);
          LdMatrixX4(bk, sK + Swz(key, 4 * pr + (lane >> 3)));
#pragma unroll
          for (int mr = 0; mr < MR; ++mr) {
            Mma16<KV8>(s[mr][nt], qf[mr][2 * pr], bk[0], bk[1]);
            Mma16<KV8>(s[mr][nt], qf[mr][2 * pr + 1], bk[2], bk[3]);
          }
        }
      }
    }
    // Scale, mask (only on tiles that cross a row's key range), online softmax.
    const int tile_base = start + t * kTile;
    const bool unmasked = all_rows && tile_base >= lo_all && tile_base + kTile - 1 <= pos_all;
    // KV8: each score times its key's K scale, each probability (after the
    // sum) times its V scale; kDirect reads them from the stage, where a key
    // outside the rows' range gets V scale 0 (its probability is 0, its
    // scale may be stale), and folds the softmax scale into the K scale.
    float vscale[kNt][2];
    if constexpr (kDirect) {
      const float qk_scale = p.scale_log2;
#pragma unroll
      for (int nt = 0; nt < kNt; ++nt) {
        const int key = ko + nt * 8 + 2 * t4;
        const uint32_t kw = *reinterpret_cast<const uint32_t*>(stS + key * 2);
        const uint32_t vw =
            *reinterpret_cast<const uint32_t*>(stS + fp8_tile::kScaleBytes + key * 2);
        const float k0 = qk_scale * Bf16Lo(kw), k1 = qk_scale * Bf16Hi(kw);
        s[0][nt][0] *= k0;
        s[0][nt][1] *= k1;
        s[0][nt][2] *= k0;
        s[0][nt][3] *= k1;
        vscale[nt][0] = kPScale * Bf16Lo(vw);
        vscale[nt][1] = kPScale * Bf16Hi(vw);
        if (!unmasked) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int j = base + nt * 8 + 2 * t4 + e;
            if (j < kr.lo || j > kr.hi) vscale[nt][e] = 0.f;
          }
        }
      }
    } else if constexpr (KV8) {
#pragma unroll
      for (int mr = 0; mr < MR; ++mr)
#pragma unroll
        for (int nt = 0; nt < kNt; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) s[mr][nt][e] *= sScale[ko + nt * 8 + 2 * t4 + (e & 1)];
    }
    // The rows' maxima are taken over the raw scores and scaled once, and
    // each probability is exp2(score * scale - max) in one FMA and one
    // MUFU (subnormal results flushed), so a score costs ~4 instructions.
    const float scale_log2 = kDirect ? 1.f : p.scale_log2;  // (kDirect: applied above)
#pragma unroll
    for (int mr = 0; mr < MR; ++mr) {
      float mx[2] = {kNoMax, kNoMax};
      if (unmasked) {
#pragma unroll
        for (int nt = 0; nt < kNt; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) mx[e >> 1] = fmaxf(mx[e >> 1], s[mr][nt][e]);
      } else {
#pragma unroll
        for (int nt = 0; nt < kNt; ++nt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int j = base + nt * 8 + 2 * t4 + (e & 1);
            const int hr = e >> 1;
            const bool ok = j <= pos_r[mr][hr] && j >= lo_r[mr][hr];
            s[mr][nt][e] = ok ? s[mr][nt][e] : -INFINITY;
            mx[hr] = fmaxf(mx[hr], s[mr][nt][e]);
          }
        }
      }
      float corr[2];
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        mx[hr] = fmaxf(mx[hr], __shfl_xor_sync(0xffffffffu, mx[hr], 1));
        mx[hr] = fmaxf(mx[hr], __shfl_xor_sync(0xffffffffu, mx[hr], 2));
        const float m_new = fmaxf(m_run[mr][hr], mx[hr] * scale_log2);
        corr[hr] = Exp2Ftz(m_run[mr][hr] - m_new);
        m_run[mr][hr] = m_new;
        l_run[mr][hr] *= corr[hr];
      }
      // Skipped when no row's maximum moved (a factor of exactly 1).
      if (__any_sync(0xffffffffu, corr[0] != 1.f || corr[1] != 1.f)) {
#pragma unroll
        for (int nd = 0; nd < 8; ++nd) {
          acc[mr][nd][0] *= corr[0];
          acc[mr][nd][1] *= corr[0];
          acc[mr][nd][2] *= corr[1];
          acc[mr][nd][3] *= corr[1];
        }
      }
#pragma unroll
      for (int nt = 0; nt < kNt; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          s[mr][nt][e] = Exp2Ftz(fmaf(s[mr][nt][e], scale_log2, -m_run[mr][e >> 1]));
          l_run[mr][e >> 1] += s[mr][nt][e];
          if constexpr (kDirect) {
            s[mr][nt][e] *= vscale[nt][e & 1];
          } else if constexpr (KV8) {
            s[mr][nt][e] *= sScale[kTile + ko + nt * 8 + 2 * t4 + (e & 1)];
          }
        }
      }
    }
    // P V: P's C fragments of two adjacent n-tiles form one A fragment.
    if constexpr (WG) {
      uint32_t a[MR][kNt / 2][4];
#pragma unroll
      for (int mr = 0; mr < MR; ++mr)
#pragma unroll
        for (int kj = 0; kj < kNt / 2; ++kj) {
          a[mr][kj][0] = PackBf16(s[mr][2 * kj][0], s[mr][2 * kj][1]);
          a[mr][kj][1] = PackBf16(s[mr][2 * kj][2], s[mr][2 * kj][3]);
          a[mr][kj][2] = PackBf16(s[mr][2 * kj + 1][0], s[mr][2 * kj + 1][1]);
          a[mr][kj][3] = PackBf16(s[mr][2 * kj + 1][2], s[mr][2 * kj + 1][3]);
        }
      const uint64_t desc_v = ptx::SmemDescSw128(sV);
      // The rescaled accumulators and P's fragments are written before the
      // fence (the empty asm statements keep the compiler from sinking those
      // writes past it, where wgmma could read the old values).
#pragma unroll
      for (int mr = 0; mr < MR; ++mr) {
        ptx::FenceWgmmaTile(acc[mr]);
#pragma unroll
        for (int kj = 0; kj < kNt / 2; ++kj) ptx::FenceWgmmaFragment(a[mr][kj]);
      }
      ptx::WgmmaFence();
#pragma unroll
      for (int mr = 0; mr < MR; ++mr)
#pragma unroll
        for (int kj = 0; kj < kNt / 2; ++kj)
          ptx::WgmmaBf16N64<1>(acc[mr], a[mr][kj], desc_v + 128 * kj, 1);  // +2048 bytes
      ptx::WgmmaCommit();
      ptx::WgmmaWaitAll();
#pragma unroll
      for (int mr = 0; mr < MR; ++mr) {
        ptx::FenceWgmmaTile(acc[mr]);
#pragma unroll
        for (int kj = 0; kj < kNt / 2; ++kj) ptx::FenceWgmmaFragment(a[mr][kj]);
      }
    }
#pragma unroll
    for (int kj = 0; kj < (WG ? 0 : kNt / 2); ++kj) {
      uint32_t a[MR][4];
      if constexpr (kDirect) {
        a[0][0] = PackF16Sat(s[0][2 * kj][0], s[0][2 * kj][1]);
        a[0][1] = PackF16Sat(s[0][2 * kj][2], s[0][2 * kj][3]);
        a[0][2] = PackF16Sat(s[0][2 * kj + 1][0], s[0][2 * kj + 1][1]);
        a[0][3] = PackF16Sat(s[0][2 * kj + 1][2], s[0][2 * kj + 1][3]);
        PvFp8(acc[0], a[0], stV, ko + kj * 16, lane);
      } else {
#pragma unroll
        for (int mr = 0; mr < MR; ++mr) {
          a[mr][0] = Pack16<KV8>(s[mr][2 * kj][0], s[mr][2 * kj][1]);
          a[mr][1] = Pack16<KV8>(s[mr][2 * kj][2], s[mr][2 * kj][3]);
          a[mr][2] = Pack16<KV8>(s[mr][2 * kj + 1][0], s[mr][2 * kj + 1][1]);
          a[mr][3] = Pack16<KV8>(s[mr][2 * kj + 1][2], s[mr][2 * kj + 1][3]);
        }
#pragma unroll
        for (int np = 0; np < 4; ++np) {
          uint32_t bv[4];
          const int key = ko + kj * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
          LdMatrixX4Trans(bv, sV + Swz(key, 2 * np + (lane >> 4)));
#pragma unroll
          for (int mr = 0; mr < MR; ++mr) {
            Mma16<KV8>(acc[mr][2 * np], a[mr], bv[0], bv[1]);
            Mma16<KV8>(acc[mr][2 * np + 1], a[mr], bv[2], bv[3]);
          }
        }
      }
    }
  }

  CpAsyncWait<0>();
  if constexpr (kKs == 1 && !FUSED) {
    // Prefill: each warp holds whole rows (its quad's lanes share a row's
    // maximum and sum), so it normalises them with the sink in registers:
    // the sink's factor once per row, then a multiply per value and
    // bf16-pair stores. (Before, every output value went through shared
    // memory with its own division by the group, sink load, two exp2f and
    // division: ~55% of a 2,048-token windowed call's instructions.)
    constexpr float kInv = KV8 ? 1.f / kPScale : 1.f;
#pragma unroll
    for (int mr = 0; mr < MR; ++mr)
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        const float l = QuadSum(l_run[mr][hr]);
        const int row = row0 + tile_of(mr) * 16 + g4 + hr * 8;
        if (row >= rows_total) continue;
        const int i = row / p.group;
        const int h = g * p.group + row % p.group;
        const float scale = kInv * SinkScale(m_run[mr][hr], l, p.sinks[h]);
        uint16_t* o = p.out + (static_cast<size_t>(qs + i) * p.q_heads + h) * kD;
        if constexpr (kDirect) {
          // n-tile 2 c + parity, column n: dimension 16 c + 2 n + parity.
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            *reinterpret_cast<uint2*>(o + 16 * c + 4 * t4) = make_uint2(
                PackBf16(acc[mr][2 * c][2 * hr] * scale, acc[mr][2 * c + 1][2 * hr] * scale),
                PackBf16(acc[mr][2 * c][2 * hr + 1] * scale,
                         acc[mr][2 * c + 1][2 * hr + 1] * scale));
          }
        } else {
#pragma unroll
          for (int nd = 0; nd < 8; ++nd) {
            *reinterpret_cast<uint32_t*>(o + nd * 8 + 2 * t4) =
                PackBf16(acc[mr][nd][2 * hr] * scale, acc[mr][nd][2 * hr + 1] * scale);
          }
        }
      }
    return;
  }
  // Merge the warps of each row group through shared memory (the K/V ring is
  // free now), then normalise with the sink or write the split's partial.
  __syncthreads();
  float* red_acc = reinterpret_cast<float*>(sKV);  // [kKs][kRows][D]
  float* red_m = red_acc + kKs * kRows * kD;       // [kKs][kRows]
  float* red_l = red_m + kKs * kRows;              // [kKs][kRows]
#pragma unroll
  for (int mr = 0; mr < MR; ++mr)
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      const float l = QuadSum(l_run[mr][hr]);
      const int r = (rg * MR + mr) * 16 + g4 + hr * 8;
      if (t4 == 0) {
        red_m[kslot * kRows + r] = m_run[mr][hr];
        red_l[kslot * kRows + r] = l;
      }
      float* dst = red_acc + (kslot * kRows + r) * kD;
      if constexpr (kDirect) {
        // n-tile 2 c + parity, column n: dimension 16 c + 2 n + parity.
        constexpr float kInv = 1.f / kPScale;
#pragma unroll
        for (int c = 0; c < 4; ++c)
          *reinterpret_cast<float4*>(dst + 16 * c + 4 * t4) =
              make_float4(kInv * acc[mr][2 * c][2 * hr], kInv * acc[mr][2 * c + 1][2 * hr],
                          kInv * acc[mr][2 * c][2 * hr + 1], kInv * acc[mr][2 * c + 1][2 * hr + 1]);
      } else {
        constexpr float kInv = KV8 ? 1.f / kPScale : 1.f;
#pragma unroll
        for (int nd = 0; nd < 8; ++nd) {
          float2 v2 = make_float2(kInv * acc[mr][nd][2 * hr], kInv * acc[mr][nd][2 * hr + 1]);
          *reinterpret_cast<float2*>(dst + nd * 8 + 2 * t4) = v2;
        }
      }
    }
  __syncthreads();
  // Splits that hold keys of this row block (every CTA computes the same
  // count); with one, this CTA writes the output itself.
  const int ns = FUSED ? min(p.splits, (kr.hi - tile_lo) / p.chunk + 1) : 1;
  // A thread per row first: the weight of each key slot's sums (its share of
  // the row's maximum and, with one split, the sink's normalisation folded
  // in), the row's output offset, and a split's (max, sum). Then each value
  // is its slots' weighted sum (before, every value redid the row's work:
  // a division by the group, the sink, three exp2f and a division).
  float* red_w = red_l + kKs * kRows;                              // [kKs][kRows]
  auto* red_off = reinterpret_cast<size_t*>(red_w + kKs * kRows);  // [kRows]
  for (int r = tid; r < kRows; r += kThreads) {
    const int row = row0 + r;
    if (row >= rows_total) break;
    float M = kNoMax;
#pragma unroll
    for (int k = 0; k < kKs; ++k) M = fmaxf(M, red_m[k * kRows + r]);
    float f[kKs], l = 0.f;
#pragma unroll
    for (int k = 0; k < kKs; ++k) {
      f[k] = exp2f(red_m[k * kRows + r] - M);
      l += red_l[k * kRows + r] * f[k];
    }
    const int i = row / p.group;
    const int h = g * p.group + row % p.group;
    float scale = 1.f;
    if (ns == 1) {
      scale = SinkScale(M, l, p.sinks[h]);
      red_off[r] = (static_cast<size_t>(qs + i) * p.q_heads + h) * kD;
    } else {
      const size_t slot =
          ((static_cast<size_t>(b) * p.splits + split) * p.max_q + i) * p.q_heads + h;
      p.part_ml[slot * 2] = M;
      p.part_ml[slot * 2 + 1] = l;
      red_off[r] = slot * kD;
    }
#pragma unroll
    for (int k = 0; k < kKs; ++k) red_w[k * kRows + r] = f[k] * scale;
  }
  __syncthreads();
  for (int idx = tid; idx < kRows * kD; idx += kThreads) {
    const int r = idx / kD, d = idx % kD;
    if (row0 + r >= rows_total) break;
    float a = 0.f;
#pragma unroll
    for (int k = 0; k < kKs; ++k) a += red_acc[(k * kRows + r) * kD + d] * red_w[k * kRows + r];
    if (ns == 1) {
      p.out[red_off[r] + d] = __bfloat16_as_ushort(__float2bfloat16_rn(a));
    } else {
      p.part_acc[red_off[r] + d] = a;
    }
  }
  if constexpr (FUSED) {
    if (ns > 1) MergeSplits<kIsWide<STAGES, KV8>>(p, red_w, b, g, qs, rows_total, ns);
  }
}

int SmCount() {
  int dev = 0, sms = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return 132;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) return 132;
  return sms > 0 ? sms : 132;
}

int CeilDiv(long a, long b) { return static_cast<int>((a + b - 1) / b); }

// Splits per sequence wanted by the 4-CTAs-per-SM shape for `batch`
// sequences (before capping by length).
int WantedSplits(int batch, int sms) {
  return std::max(1, static_cast<int>(static_cast<long>(kDecodeCtasPerSm) * sms /
                                      (static_cast<long>(batch) * kTypicalKvHeads)));
}

// The fewest kv heads a decode-path call can have: max_q * group <= 32.
int MinDecodeKvHeads(int q_heads, int max_q) {
  return std::max(1, CeilDiv(static_cast<long>(q_heads) * max_q, kDecodeMaxRows));
}

struct SplitPlan {
  int splits = 1;
  int chunk = 0;  // keys
  bool wide = false;
};

// Host-only: depends on max_seq_len, max_q, window, batch, kv_heads, the SM
// count and the cache's type. Wide (2 CTAs per SM, 2 * SMs / (batch *
// kv_heads) splits; bf16 layers only) when that grid fills at least 90% of
// those slots, else at most one wave of 4 CTAs per SM. splits <=
// min(max(WantedSplits, 2 * SMs / (batch * MinDecodeKvHeads)),
// ceil(max_seq_len / 64)), the bound the workspace is sized for.
SplitPlan PlanSplits(int max_seq_len, int max_q, int window, int batch, int kv_heads, int sms,
                     bool fp8) {
  long eff = std::max(1, max_seq_len);
  // With a window the range spans at most window + max_q - 1 keys, plus the
  // alignment of its first tile.
  if (window > 0) eff = std::min<long>(eff, static_cast<long>(window) + max_q - 1 + kTile - 1);
  const int tiles = CeilDiv(eff, kTile);
  const long heads = static_cast<long>(batch) * kv_heads;
  const long slots = static_cast<long>(kWideCtasPerSm) * sms;
  const long wide = heads <= slots ? slots / heads : 0;
  SplitPlan plan;
  plan.wide = !fp8 && wide >= 1 && wide * heads * 10 >= 9 * slots;
  const int want = plan.wide ? static_cast<int>(wide) : WantedSplits(batch, sms);
  const int min_tiles = plan.wide ? kWideMinTilesPerSplit : kMinTilesPerSplit;
  const int chunk_tiles = std::max(min_tiles, CeilDiv(tiles, want));
  plan.splits = CeilDiv(tiles, chunk_tiles);
  plan.chunk = chunk_tiles * kTile;
  if (plan.splits > 1 && heads > kMaxCounters) {
    plan.splits = 1;
    plan.chunk = tiles * kTile;
  }
  return plan;
}

// Dynamic shared memory: the Q rows and the ring (KV8: the ring of codes,
// the converted tile and its scales, and at least the final reduction's
// buffers, which reuse that space).
template <int RG, int MR, int STAGES, bool KV8, bool WG = false>
size_t SmemBytes() {
  const size_t q = static_cast<size_t>(16 * RG * MR * kD) * sizeof(uint16_t);
  // WG: slack to align the stages to 1024 bytes.
  if constexpr (!KV8) return (WG ? 1024 : 0) + q + STAGES * kStageElems * sizeof(uint16_t);
  const size_t rows = 16 * RG * MR, ks = 4 / RG;
  // Partial sums, maxima, sums and weights per key slot and row, the rows'
  // output offsets, and MergeSplits' flag.
  const size_t reduce =
      (ks * rows * kD + 3 * ks * rows) * sizeof(float) + rows * sizeof(size_t) + 16;
  // Decode CTAs (MR 1) read the ring's codes directly; prefill converts.
  const size_t ring = STAGES * fp8_tile::kStageBytes + (MR == 1 ? 0 : fp8_tile::kConvertedBytes);
  return q + std::max(ring, reduce);
}

template <int RG, int MR, int STAGES, bool FUSED, bool KV8, bool WG = false>
cudaError_t LaunchKernel(const Params& p, int row_blocks, int batch, cudaStream_t stream) {
  const size_t smem = SmemBytes<RG, MR, STAGES, KV8, WG>();
  cudaError_t err =
      cudaFuncSetAttribute(AttentionKernel<RG, MR, STAGES, FUSED, KV8, WG>,
                           cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (err != cudaSuccess) return err;
  return LaunchPdl(AttentionKernel<RG, MR, STAGES, FUSED, KV8, WG>,
                   dim3(row_blocks * p.splits, p.kv_heads, batch), dim3(kThreads), smem, stream,
                   /*pdl=*/true, p);
}

// The decode kernel of a split plan: wide or 4 per SM, 16 or 32 rows, with or
// without the in-kernel merge.
template <bool KV8, int STAGES>
cudaError_t LaunchDecodeShape(const Params& p, int rows, int batch, cudaStream_t stream) {
  const bool fused = p.splits > 1;
  if (rows <= 16)
    return fused ? LaunchKernel<1, 1, STAGES, true, KV8>(p, 1, batch, stream)
                 : LaunchKernel<1, 1, STAGES, false, KV8>(p, 1, batch, stream);
  return fused ? LaunchKernel<2, 1, STAGES, true, KV8>(p, 1, batch, stream)
               : LaunchKernel<2, 1, STAGES, false, KV8>(p, 1, batch, stream);
}

template <bool KV8>
cudaError_t LaunchDecode(const Params& p, const SplitPlan& plan, int rows, int batch,
                         cudaStream_t stream) {
  if constexpr (KV8) {
    return LaunchDecodeShape<true, kStages8>(p, rows, batch, stream);
  } else {
    if (plan.wide) return LaunchDecodeShape<false, kWideStages>(p, rows, batch, stream);
    return LaunchDecodeShape<false, kStages>(p, rows, batch, stream);
  }
}

// The layer's K and V arrays are set (FP8: with room for the scales).
bool KvArraysOk(const PagedKvLayer& c) {
  if (!c.fp8()) return c.k != nullptr && c.v != nullptr;
  return c.v8 != nullptr && c.fp8_block_bytes % 16 == 0 &&
         c.fp8_block_bytes >= static_cast<long long>(c.kv_heads) * c.block_size * (c.head_dim + 2);
}

}  // namespace

size_t AttentionWorkspaceBytes(const AttentionBatch& batch, int q_heads, int head_dim) {
  if (batch.batch <= 0 || batch.max_q_per_seq <= 0 || batch.max_q_per_seq > kDecodeMaxQ ||
      q_heads <= 0)
    return 0;
  const int sms = SmCount();
  const int tiles = CeilDiv(std::max(1, batch.max_seq_len), kTile);
  const long wide =
      static_cast<long>(kWideCtasPerSm) * sms /
      (static_cast<long>(batch.batch) * MinDecodeKvHeads(q_heads, batch.max_q_per_seq));
  const int splits = std::min<long>(std::max<long>(WantedSplits(batch.batch, sms), wide), tiles);
  if (splits <= 1) return 0;
  return kCounterBytes + static_cast<size_t>(batch.batch) * splits * batch.max_q_per_seq * q_heads *
                             (head_dim + 2) * sizeof(float);
}

cudaError_t LaunchAttention(const uint16_t* q, const PagedKvLayer& cache,
                            const AttentionBatch& batch, int q_heads, const float* sinks,
                            int window, float scale, uint16_t* out, void* workspace,
                            size_t workspace_bytes, cudaStream_t stream, bool prefill_wgmma) {
  if (batch.batch < 0 || batch.total_q < 0) return cudaErrorInvalidValue;
  if (batch.batch == 0 || batch.total_q == 0) return cudaSuccess;
  if (q == nullptr || out == nullptr || sinks == nullptr || !KvArraysOk(cache) ||
      batch.block_tables == nullptr || batch.seq_lens == nullptr || batch.q_start == nullptr)
    return cudaErrorInvalidValue;
  if (cache.head_dim != kD || cache.kv_heads <= 0 || q_heads <= 0 || q_heads % cache.kv_heads != 0)
    return cudaErrorInvalidValue;
  if (cache.block_size <= 0 || (cache.block_size & (cache.block_size - 1)) != 0)
    return cudaErrorInvalidValue;
  if (batch.max_q_per_seq <= 0 || batch.max_seq_len <= 0 || batch.max_blocks_per_seq <= 0 ||
      window < 0)
    return cudaErrorInvalidValue;
  Params p{};
  p.q = q;
  p.k = cache.k;
  p.v = cache.v;
  p.k8 = cache.k8;
  p.v8 = cache.v8;
  p.blk_bytes = cache.fp8_block_bytes;
  p.scale_off = cache.kv_heads * cache.block_size * kD;
  p.block_tables = batch.block_tables;
  p.seq_lens = batch.seq_lens;
  p.q_start = batch.q_start;
  p.sinks = sinks;
  p.out = out;
  p.max_blocks = batch.max_blocks_per_seq;
  p.q_heads = q_heads;
  p.kv_heads = cache.kv_heads;
  p.group = q_heads / cache.kv_heads;
  int shift = 0;
  while ((1 << shift) < cache.block_size) ++shift;
  p.block_shift = shift;
  p.window = window;
  p.scale_log2 = scale * kLog2e;
  p.max_q = batch.max_q_per_seq;

  const int rows = batch.max_q_per_seq * p.group;
  if (batch.max_q_per_seq <= kDecodeMaxQ && rows <= kDecodeMaxRows) {
    const SplitPlan plan = PlanSplits(batch.max_seq_len, batch.max_q_per_seq, window, batch.batch,
                                      cache.kv_heads, SmCount(), cache.fp8());
    p.splits = plan.splits;
    p.chunk = plan.chunk;
    if (p.splits > 1) {
      const size_t slots =
          static_cast<size_t>(batch.batch) * p.splits * batch.max_q_per_seq * q_heads;
      if (workspace == nullptr ||
          workspace_bytes < kCounterBytes + slots * (kD + 2) * sizeof(float))
        return cudaErrorInvalidValue;
      p.counters = static_cast<unsigned*>(workspace);
      p.part_acc = reinterpret_cast<float*>(static_cast<char*>(workspace) + kCounterBytes);
      p.part_ml = p.part_acc + slots * kD;
    }
    return cache.fp8() ? LaunchDecode<true>(p, plan, rows, batch.batch, stream)
                       : LaunchDecode<false>(p, plan, rows, batch.batch, stream);
  }
  p.splits = 1;
  p.chunk = 1 << 30;
  const bool wg = !cache.fp8() && prefill_wgmma;
  if (window > 0 || batch.max_seq_len <= kPrefillNarrowMaxLen) {
    const int row_blocks = CeilDiv(rows, 64);
    if (wg)
      return LaunchKernel<4, 1, kStages, false, false, true>(p, row_blocks, batch.batch, stream);
    return cache.fp8()
               ? LaunchKernel<4, 1, kStages, false, true>(p, row_blocks, batch.batch, stream)
               : LaunchKernel<4, 1, kStages, false, false>(p, row_blocks, batch.batch, stream);
  }
  const int row_blocks = CeilDiv(rows, 64 * kPrefillMr);
  if (wg)
    return LaunchKernel<4, kPrefillMr, kStages, false, false, true>(p, row_blocks, batch.batch,
                                                                    stream);
  return cache.fp8()
             ? LaunchKernel<4, kPrefillMr, kStages, false, true>(p, row_blocks, batch.batch, stream)
             : LaunchKernel<4, kPrefillMr, kStages, false, false>(p, row_blocks, batch.batch,
                                                                  stream);
}

}  // namespace flotilla::kernels::cuda
