// LaunchNormQkvRope: the attention input of a few tokens in one launch (the
// input RMSNorm, the QKV projection, RoPE and the paged KV write), replacing
// three launches and their gaps in a decode step.
//
// The projection is the tensor-core GEMV of linear.cu (a block owns 16 weight
// rows, 8 warps split the input, mma.sync m16n8k16 fed from 16-byte loads);
// what differs is where the activations come from and where the results go:
//  - Every block normalises the f32 residual itself: the per-token sum of
//    squares over the whole row (the residual is small and stays in L1/L2),
//    then bf16(weight * (x * inv)) rounded as AddRmsNormKernel rounds it,
//    staged in shared memory, from which the warps read their B fragments.
//  - The rows are in QkvRowOrder::kRopePairs, so both halves of a rotated
//    pair sit in adjacent threads of the epilogue: one shuffle brings the
//    partner, and q goes out in bf16, k and v into the cache.
// Programmatic dependent launch: before waiting for the previous kernel (which
// writes the residual) each block asks L2 for its whole weight tile and loads
// its first slices into registers (and, staging, copies the next ones into
// shared memory), so the weights stream while that kernel drains and while
// the norm is computed; the next kernel may launch once the projection is
// done (NormQkvRopeTuning has the measured alternatives).
#include <cuda_bf16.h>

#include "kernels/cuda/gemv.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/ptx.cuh"

namespace flotilla::kernels::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxTokens = kNormQkvRopeMaxTokens;  // one n8 tile
static_assert(kMaxTokens <= 8, "the kernel uses a single 8-token mma tile");
constexpr int kUnroll = 4;  // 32-wide input slices of weights in flight per warp
// bf16 elements appended to each staged activation row: with a row stride of
// hidden + 32 the two tokens read in one 16-byte-load phase hit disjoint banks.
constexpr int kRowPad = 32;
constexpr int kRedBytes = kWarps * 16 * 17 * static_cast<int>(sizeof(float));
constexpr int kMaxSmemBytes = 96 * 1024;
constexpr int kMaxHalf = 128;  // head_dim <= 256
// Staging (NormQkvRopeTuning::stage_weights): slices per warp copied into
// shared memory before the wait, each 32 lanes x 2 rows x 16 bytes, taken
// only while a block's shared memory stays within kStageMaxSmemBytes (three
// blocks per SM, as __launch_bounds__ asks).
constexpr int kStageSlices = 7;
constexpr size_t kStageBytes = static_cast<size_t>(kWarps) * kStageSlices * 2 * 32 * sizeof(uint4);
constexpr size_t kStageMaxSmemBytes = 72 * 1024;

// The staged activations, which the warps' partial tiles reuse at the end.
size_t ActivationBytes(int tokens, int hidden) {
  const size_t staged = static_cast<size_t>(tokens) * (hidden + kRowPad) * sizeof(uint16_t);
  const size_t bytes = staged > static_cast<size_t>(kRedBytes) ? staged : kRedBytes;
  return (bytes + 15) / 16 * 16;
}

size_t SmemBytes(int tokens, int hidden, bool stage) {
  return ActivationBytes(tokens, hidden) + (stage ? kStageBytes : 0);
}

// At most 85 registers: 3 blocks per SM, as GemvMmaKernel.
// kEarly: the first kUnroll input slices of weights are loaded into registers
// before waiting for the previous kernel (as GemvMmaKernel does), on top of or
// instead of the L2 prefetch.
// kTok: tokens rounded up to 1, 2, 4 or 8 (the sum of squares keeps
// 8 / kTok steps of loads in flight per thread, at most 8 float4).
// stage: slices per warp after its first kUnroll copied into shared memory
// at `staged` before the wait (0: none); each lane copies and later reads
// only its own 16-byte pieces, so its cp.async wait is the only barrier.
template <int kTok, bool kEarly>
__global__ void __launch_bounds__(kThreads, 3)
    NormQkvRopeKernel(const float* __restrict__ x, const uint16_t* __restrict__ norm_w, float eps,
                      const uint16_t* __restrict__ w, const uint16_t* __restrict__ bias, int tokens,
                      int hidden, int q_heads, int kv_heads, int head_dim,
                      const int32_t* __restrict__ positions, const int32_t* __restrict__ slots,
                      const float* __restrict__ inv_freq, float scaling, uint16_t* __restrict__ kc,
                      uint16_t* __restrict__ vc, int block_size, long long cache_slots,
                      bool l2_prefetch, bool late_dependents, int stage, int staged,
                      uint16_t* __restrict__ q_out) {
  extern __shared__ uint4 smem[];
  __shared__ float part[kWarps][kRmsMaxTokens];
  __shared__ float inv_s[kMaxTokens];
  uint16_t* xs = reinterpret_cast<uint16_t*>(smem);  // [tokens][hidden + kRowPad]
  const int stride = hidden + kRowPad;
  const int out = (q_heads + 2 * kv_heads) * head_dim;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, q = lane & 3;
  const int row0 = blockIdx.x * 16;

  const int chunks = hidden >> 5;
  const int c_begin = warp * chunks / kWarps;
  const int c_end = (warp + 1) * chunks / kWarps;
  const int ra = min(row0 + g, out - 1), rb = min(row0 + g + 8, out - 1);
  const uint4* wa = reinterpret_cast<const uint4*>(w + static_cast<size_t>(ra) * hidden) + q;
  const uint4* wb = reinterpret_cast<const uint4*>(w + static_cast<size_t>(rb) * hidden) + q;
  uint4 va[kUnroll], vb[kUnroll];
  auto load_first = [&] {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (c_begin + u < c_end) {
        va[u] = LoadStream(wa + (c_begin + u) * 4);
        vb[u] = LoadStream(wb + (c_begin + u) * 4);
      }
    }
  };

  if (!late_dependents) asm volatile("griddepcontrol.launch_dependents;");
  if (l2_prefetch && threadIdx.x == 0) {
    // The block's 16 weight rows are contiguous: one bulk prefetch into L2.
    const int rows = min(16, out - row0);
    const uint32_t bytes = static_cast<uint32_t>(rows) * hidden * sizeof(uint16_t);
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(
                     w + static_cast<size_t>(row0) * hidden),
                 "r"(bytes)
                 : "memory");
  }
  if (threadIdx.x == 32) {
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(norm_w),
                 "r"(static_cast<uint32_t>(hidden * sizeof(uint16_t)))
                 : "memory");
  }
  if (kEarly) load_first();
  uint4* const wst = smem + staged + warp * stage * 64;  // this warp's staged slices
  if (stage > 0) {
    for (int i = 0; i < stage; ++i) {
      const int c = c_begin + kUnroll + i;
      if (c < c_end) {
        ptx::CpAsync16(wst + (2 * i) * 32 + lane, wa + c * 4, 16);
        ptx::CpAsync16(wst + (2 * i + 1) * 32 + lane, wb + c * 4, 16);
      }
    }
    ptx::CpAsyncCommit();
  }
  asm volatile("griddepcontrol.wait;" ::: "memory");

  // 1. The tokens' inverse RMS over whole rows.
  BlockInverseRms<kTok, kThreads>(x, tokens, hidden, eps, part, inv_s);

  // 2. The normed activations in bf16, staged for the B fragments (x again
  // from L1; two steps of loads in flight per thread).
  const int h8 = hidden >> 3;
  const int n8 = tokens * h8;
  for (int e0 = threadIdx.x; e0 < n8; e0 += 2 * kThreads) {
    float4 a[2], b[2];
    uint4 wn[2];
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int e = e0 + u * kThreads;
      if (e < n8) {
        const int t = e / h8, c = e - t * h8;
        const float4* xr =
            reinterpret_cast<const float4*>(x + static_cast<size_t>(t) * hidden) + 2 * c;
        a[u] = __ldg(xr);
        b[u] = __ldg(xr + 1);
        wn[u] = __ldg(reinterpret_cast<const uint4*>(norm_w) + c);
      }
    }
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int e = e0 + u * kThreads;
      if (e < n8) {
        const int t = e / h8, c = e - t * h8;
        const float inv = inv_s[t];
        uint4 o;
        o.x = NormPair(a[u].x, a[u].y, wn[u].x, inv);
        o.y = NormPair(a[u].z, a[u].w, wn[u].y, inv);
        o.z = NormPair(b[u].x, b[u].y, wn[u].z, inv);
        o.w = NormPair(b[u].z, b[u].w, wn[u].w, inv);
        *reinterpret_cast<uint4*>(xs + static_cast<size_t>(t) * stride + 8 * c) = o;
      }
    }
  }
  __syncthreads();

  // 3. The GEMV (see linear.cu for the fragment layout).
  const bool has = g < tokens;
  const uint4* xg = reinterpret_cast<const uint4*>(xs + static_cast<size_t>(has ? g : 0) * stride) + q;
  float acc[1][4] = {{0.0f, 0.0f, 0.0f, 0.0f}};
  if (!kEarly) load_first();
  if (stage > 0) ptx::CpAsyncWait<0>();
  for (int c = c_begin; c < c_end; c += kUnroll) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (c + u < c_end) {
        const uint4 vx = has ? xg[(c + u) * 4] : make_uint4(0, 0, 0, 0);
        Mma(acc[0], va[u].x, vb[u].x, va[u].y, vb[u].y, vx.x, vx.y);
        Mma(acc[0], va[u].z, vb[u].z, va[u].w, vb[u].w, vx.z, vx.w);
      }
    }
    const int next = c + kUnroll;
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int i = next + u - c_begin - kUnroll;  // staged slice index
      if (next + u >= c_end) continue;
      if (i < stage) {
        va[u] = wst[(2 * i) * 32 + lane];
        vb[u] = wst[(2 * i + 1) * 32 + lane];
      } else {
        va[u] = LoadStream(wa + (next + u) * 4);
        vb[u] = LoadStream(wb + (next + u) * 4);
      }
    }
  }

  if (late_dependents) asm volatile("griddepcontrol.launch_dependents;");
  // 4. The warps' partial tiles summed in shared memory (reusing the staged
  // activations), bias, RoPE and the stores.
  __syncthreads();
  float(*red)[16][17] = reinterpret_cast<float(*)[16][17]>(smem);
  float s = SumWarpTiles<1, kWarps>(red, acc, tokens);
  const int tok = threadIdx.x >> 4, r = threadIdx.x & 15;
  const int row = row0 + r;
  if (tok < tokens && bias != nullptr && row < out) s += Bf16Bits(bias[row]);
  // Rows 2i and 2i + 1 of a head (the two halves of pair i) are lanes r, r ^ 1.
  const float partner = __shfl_xor_sync(0xffffffffu, s, 1);
  if (tok >= tokens || row >= out) return;
  const long long slot = slots != nullptr ? slots[tok] : -1;
  const bool store = slot >= 0 && slot < cache_slots;
  const long long blk = store ? slot / block_size : 0;
  const int off = store ? static_cast<int>(slot % block_size) : 0;
  const int qk_rows = (q_heads + kv_heads) * head_dim;
  if (row < qk_rows) {
    const int h = row / head_dim, p = row - h * head_dim, i = p >> 1;
    const bool second = (p & 1) != 0;
    const float x1 = second ? partner : s, x2 = second ? s : partner;
    const float angle = __fmul_rn(static_cast<float>(positions[tok]), inv_freq[i]);
    const float cs = cosf(angle) * scaling, sn = sinf(angle) * scaling;
    const float o1 = x1 * cs - x2 * sn;
    const float o2 = x2 * cs + x1 * sn;
    const uint16_t o = static_cast<uint16_t>(ToBf16Bits(second ? o2 : o1));
    const int dim = i + (second ? head_dim / 2 : 0);
    if (h < q_heads) {
      q_out[(static_cast<size_t>(tok) * q_heads + h) * head_dim + dim] = o;
    } else if (store) {
      kc[((blk * kv_heads + (h - q_heads)) * block_size + off) * head_dim + dim] = o;
    }
  } else if (store) {
    const int vr = row - qk_rows, kh = vr / head_dim, dim = vr - kh * head_dim;
    vc[((blk * kv_heads + kh) * block_size + off) * head_dim + dim] =
        static_cast<uint16_t>(ToBf16Bits(s));
  }
}

}  // namespace

bool NormQkvRopeSupported(int tokens, int hidden, int head_dim) {
  return tokens >= 0 && tokens <= kNormQkvRopeMaxTokens && hidden > 0 && hidden % 32 == 0 &&
         head_dim > 0 && head_dim % 2 == 0 && head_dim / 2 <= kMaxHalf &&
         SmemBytes(tokens, hidden, false) <= static_cast<size_t>(kMaxSmemBytes);
}

cudaError_t LaunchNormQkvRope(const float* x, const uint16_t* norm_weight, float eps,
                              const uint16_t* wqkv, const uint16_t* bqkv, int tokens, int hidden,
                              int q_heads, const int32_t* positions, const int32_t* slots,
                              const float* inv_freq, float scaling, const PagedKvLayer& cache,
                              uint16_t* q_out, cudaStream_t stream,
                              const NormQkvRopeTuning& tuning) {
  if (x == nullptr || norm_weight == nullptr || wqkv == nullptr || positions == nullptr ||
      inv_freq == nullptr || q_out == nullptr || q_heads <= 0 || cache.kv_heads <= 0 ||
      !NormQkvRopeSupported(tokens, hidden, cache.head_dim)) {
    return cudaErrorInvalidValue;
  }
  if (slots != nullptr && (cache.k == nullptr || cache.v == nullptr || cache.block_size <= 0 ||
                           cache.num_blocks < 0)) {
    return cudaErrorInvalidValue;
  }
  if (tokens == 0) return cudaSuccess;
  const int out = (q_heads + 2 * cache.kv_heads) * cache.head_dim;
  const bool stage = tuning.stage_weights && SmemBytes(tokens, hidden, true) <= kStageMaxSmemBytes;
  const size_t smem = SmemBytes(tokens, hidden, stage);
  const long long cache_slots = static_cast<long long>(cache.num_blocks) * cache.block_size;
  const bool early = tuning.early_loads;
  // The kernel for the tokens rounded up to 1, 2, 4 or 8, and early loads or
  // not. Staged launches pass 48 KB: the limit is raised once per kernel and
  // device, not at every launch.
  using Kernel = decltype(&NormQkvRopeKernel<1, false>);
  static constexpr Kernel kKernels[8] = {NormQkvRopeKernel<1, false>, NormQkvRopeKernel<1, true>,
                                         NormQkvRopeKernel<2, false>, NormQkvRopeKernel<2, true>,
                                         NormQkvRopeKernel<4, false>, NormQkvRopeKernel<4, true>,
                                         NormQkvRopeKernel<8, false>, NormQkvRopeKernel<8, true>};
  static PerDevice<size_t> allowed[8];
  const int variant = 2 * (tokens == 1   ? 0
                           : tokens == 2 ? 1
                           : tokens <= 4 ? 2
                                         : 3) +
                      (early ? 1 : 0);
  const Kernel kernel = kKernels[variant];
  const cudaError_t err = AllowSharedBytes(kernel, smem, &allowed[variant]);
  if (err != cudaSuccess) return err;
  return LaunchPdl(kernel, dim3((out + 15) / 16), dim3(kThreads), smem, stream, true, x,
                   norm_weight, eps, wqkv, bqkv, tokens, hidden, q_heads, cache.kv_heads,
                   cache.head_dim, positions, slots, inv_freq, scaling, cache.k, cache.v,
                   cache.block_size > 0 ? cache.block_size : 1, cache_slots, tuning.l2_prefetch,
                   tuning.late_dependents, stage ? kStageSlices : 0,
                   static_cast<int>(ActivationBytes(tokens, hidden) / sizeof(uint4)), q_out);
}

}  // namespace flotilla::kernels::cuda
