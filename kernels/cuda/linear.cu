// LaunchLinear: bf16 projections with f32 results.
//
// Small batches (tokens <= 16): a GEMV on the tensor cores that streams each
// weight byte from HBM once. A block owns 16 weight rows; its 8 warps split the
// input dimension and each warp feeds mma.sync m16n8k16 straight from 16-byte
// global loads: within a 32-wide slice of the input, lane (g, q) loads the
// 8 consecutive weights w[row g, 8q..8q+7] (and row g + 8) and the 8 matching
// activations of token g. The dot product does not care in which order its
// terms are added, so those 8 values are declared to be the k positions
// {2q, 2q+1, 2q+8, 2q+9} of two consecutive k16 steps, for A and B alike: the
// fragments then need no shuffles. The 8 partial 16x16 tiles are summed in
// shared memory and bias / accumulate applied on the way out.
//
// Large batches: cuBLASLt (bf16 A/B, f32 C/D and compute, bias epilogue). The
// library is opened at run time (dlopen), so nothing that links the kernels
// needs the 500 MB libcublasLt unless a large batch is actually projected;
// without it the GEMV above runs over 16-token slices.
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <dlfcn.h>

#include <algorithm>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kernels/cuda/ep_lines.cuh"
#include "kernels/cuda/gemv.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/moe_route.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/router.h"
#include "kernels/cuda/topk.cuh"

namespace flotilla::kernels::cuda {
namespace {

constexpr int kGemvThreads = 256;
constexpr int kGemvWarps = kGemvThreads / 32;
constexpr int kSmallBatch = 16;
constexpr size_t kWorkspaceBytes = 32u << 20;
constexpr int kBiasCapacity = 1 << 18;  // f32 bias staging for the cuBLASLt epilogue

// The router's ranking fused into its projection (GemvMmaKernel's kTopK).
struct GemvTopK {
  int k = 0;
  int32_t* ids = nullptr;
  float* weights = nullptr;
  unsigned* done = nullptr;
  // The MoE's routing and f16 x, written here when route.count is set.
  MoeRouteTargets route;
};

// The grid's last block to finish ranks the rows; the fences make every
// block's sums visible before its count.
__device__ void RankAfterLastBlock(const GemvTopK& topk, int tokens, int experts, float* y) {
  __shared__ bool last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(topk.done, 1u) == gridDim.x * gridDim.y - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  const int warp = threadIdx.x >> 5;
  if (warp < tokens) {
    float* row = y + static_cast<size_t>(warp) * experts;
    WarpTopKSoftmax(row, experts, topk.k, topk.ids + static_cast<size_t>(warp) * topk.k,
                    topk.weights + static_cast<size_t>(warp) * topk.k);
    __syncwarp();
    for (int e = threadIdx.x & 31; e < experts; e += 32) row[e] = 0.0f;
  }
  if (threadIdx.x == 0) *topk.done = 0;
  if (topk.route.count != nullptr) {
    __syncthreads();  // the ids above, written by this block's warps
    BuildMoeRouting<kGemvThreads>(topk.ids, tokens * topk.k, topk.route);
  }
}

// kTpSum's epilogue: this block's outputs (thread (tok, r) holds row r of
// its 16 for token tok) summed over the TP group as flagged lines
// (ep_lines.cuh) and added to `residual`, as LaunchEpAllReduce with a
// residual adds them: the same lines, numbers and order, so a peer may run
// either. Even rows own a line of two values (out is even).
__device__ void TpSumRows(const EpLaunch& l, float s, int tok, int row, int tokens, int out,
                          float* __restrict__ residual) {
  const uint64_t deadline = GlobalTimerNs() + l.timeout_ns;
  const uint32_t epoch = TpLinesEpoch(l);
  const float next = __shfl_down_sync(0xffffffffu, s, 1);
  if ((row & 1) == 0 && tok < tokens && row < out) {
    const int64_t i = (static_cast<int64_t>(tok) * out + row) / 2;
    const float2 mine = make_float2(s, next);
    SendTpLine(l, epoch, i, mine);
    float2 sum;
    if (SumTpLine(l, epoch, i, mine, deadline, &sum)) {
      float2* r = reinterpret_cast<float2*>(residual) + i;
      const float2 before = *r;
      *r = make_float2(__fadd_rn(before.x, sum.x), __fadd_rn(before.y, sum.y));
    }
  }
  TpLinesBlockDone(l, epoch, gridDim.x * gridDim.y);
}

// kNt: tiles of 8 tokens (1 or 2).
// kNorm (kNt == 1): the RMSNorm of the input fused in. x is then unused and
// xf is the f32 residual [tokens, in]: every block first computes the tokens'
// inverse RMS over whole rows, then forms each B fragment as
// bf16(nw * (xf * inv)) with AddRmsNorm's rounding, from xf in L2; the blocks
// of row tile 0 (one per input share) also store those values to t_out (or
// not, if it is null).
// kTopK (kNorm, accumulating): the router's ranking fused after the
// projection. Every block counts itself done on topk.done once its sums are
// in y; the last one ranks each token's row (WarpTopKSoftmax, one warp per
// token), writes ids and weights, zeroes the rows and the counter.
// kTpSum (kNt == 1, one input share): the projection's rows summed over the
// TP group of `lines` in the epilogue and added to y, the residual
// (TpSumRows), instead of a separate all-reduce launch.
// At most 85 registers: 3 blocks per SM, so the 320 blocks of the QKV
// projection are all resident at once on a 132-SM part.
template <int kNt, bool kNorm, bool kTopK, bool kTpSum = false>
__global__ void __launch_bounds__(kGemvThreads, 3)
    GemvMmaKernel(const uint16_t* __restrict__ x, const float* __restrict__ xf,
                  const uint16_t* __restrict__ nw, float eps, uint16_t* __restrict__ t_out,
                  const uint16_t* __restrict__ w, const uint16_t* __restrict__ bias, int tokens,
                  int in, int out, bool accumulate, float* __restrict__ y, GemvTopK topk,
                  EpLaunch lines) {
  static_assert(!kNorm || kNt == 1, "the fused norm serves one tile of 8 tokens");
  static_assert(!kTpSum || (kNt == 1 && !kTopK), "the TP sum serves one tile of 8 tokens");
  static_assert(!kTopK || (kNorm && kRmsMaxTokens <= kGemvWarps), "a warp per token's row");
  // 32-wide input slices loaded before the first mma (fewer with 2 token tiles:
  // their activations take the registers).
  constexpr int kGemvUnroll = kNt == 1 ? 4 : 3;
  __shared__ float red[kGemvWarps][16][16 + 1];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, q = lane & 3;
  const int row0 = blockIdx.x * 16;
  // Split-K (gridDim.y > 1, accumulating only): block y takes a share of the
  // input slices and adds its partial sums into y atomically.
  const int chunks = in >> 5;
  const int split = gridDim.y, part = blockIdx.y;
  const int p_begin = part * chunks / split, p_chunks = (part + 1) * chunks / split - p_begin;
  const int c_begin = p_begin + warp * p_chunks / kGemvWarps;
  const int c_end = p_begin + (warp + 1) * p_chunks / kGemvWarps;
  const int ra = min(row0 + g, out - 1), rb = min(row0 + g + 8, out - 1);
  const uint4* wa = reinterpret_cast<const uint4*>(w + static_cast<size_t>(ra) * in) + q;
  const uint4* wb = reinterpret_cast<const uint4*>(w + static_cast<size_t>(rb) * in) + q;
  const uint4* xt[kNt];
  bool has[kNt];
#pragma unroll
  for (int n = 0; n < kNt; ++n) {
    const int tok = n * 8 + g;
    has[n] = tok < tokens;
    xt[n] = kNorm ? nullptr
                  : reinterpret_cast<const uint4*>(x + static_cast<size_t>(has[n] ? tok : 0) * in) + q;
  }
  float acc[kNt][4];
#pragma unroll
  for (int n = 0; n < kNt; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;

  // Programmatic dependent launch: stream the first weights before waiting for
  // the previous kernel (whose output x, and y when accumulating, may be); the
  // next kernel may launch once the main loop is done. No-ops without PDL.
  uint4 va[kGemvUnroll], vb[kGemvUnroll];
#pragma unroll
  for (int u = 0; u < kGemvUnroll; ++u) {
    if (c_begin + u < c_end) {
      va[u] = LoadStream(wa + (c_begin + u) * 4);
      vb[u] = LoadStream(wb + (c_begin + u) * 4);
    }
  }
  asm volatile("griddepcontrol.wait;" ::: "memory");
  // The fused norm: the lane's token row of the residual, its 8 values per
  // slice, and the inverse RMS of that token.
  const float* xr = nullptr;
  const uint4* nr = nullptr;
  uint16_t* tr = nullptr;
  uint16_t* hr = nullptr;  // kTopK with route targets: the MoE's f16 x
  float inv = 0.0f;
  if constexpr (kNorm) {
    __shared__ float part_ss[kGemvWarps][kRmsMaxTokens];
    __shared__ float inv_s[kRmsMaxTokens];
    BlockInverseRms<kRmsMaxTokens, kGemvThreads>(xf, tokens, in, eps, part_ss, inv_s);
    const int tok = has[0] ? g : 0;
    inv = inv_s[tok];
    xr = xf + static_cast<size_t>(tok) * in + 8 * q;
    nr = reinterpret_cast<const uint4*>(nw) + q;
    if (t_out != nullptr && blockIdx.x == 0 && has[0]) {
      tr = t_out + static_cast<size_t>(tok) * in + 8 * q;
    }
    if (kTopK && topk.route.xh != nullptr && blockIdx.x == 0 && has[0]) {
      hr = topk.route.xh + static_cast<size_t>(tok) * in + 8 * q;
    }
  }
  for (int c = c_begin; c < c_end; c += kGemvUnroll) {
    uint4 vx[kGemvUnroll][kNt];
#pragma unroll
    for (int u = 0; u < kGemvUnroll; ++u) {
      if (c + u < c_end) {
        if constexpr (kNorm) {
          const float4 a = __ldg(reinterpret_cast<const float4*>(xr + (c + u) * 32));
          const float4 b = __ldg(reinterpret_cast<const float4*>(xr + (c + u) * 32 + 4));
          const uint4 n = __ldg(nr + (c + u) * 4);
          vx[u][0] = has[0] ? make_uint4(NormPair(a.x, a.y, n.x, inv), NormPair(a.z, a.w, n.y, inv),
                                         NormPair(b.x, b.y, n.z, inv), NormPair(b.z, b.w, n.w, inv))
                            : make_uint4(0, 0, 0, 0);
          if (tr != nullptr) *reinterpret_cast<uint4*>(tr + (c + u) * 32) = vx[u][0];
          if (kTopK && hr != nullptr) {
            *reinterpret_cast<uint4*>(hr + (c + u) * 32) = Bf16x8ToMoeHalves(vx[u][0]);
          }
        } else {
#pragma unroll
          for (int n = 0; n < kNt; ++n) {
            vx[u][n] = has[n] ? __ldg(xt[n] + (c + u) * 4) : make_uint4(0, 0, 0, 0);
          }
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kGemvUnroll; ++u) {
      if (c + u < c_end) {
#pragma unroll
        for (int n = 0; n < kNt; ++n) {
          Mma(acc[n], va[u].x, vb[u].x, va[u].y, vb[u].y, vx[u][n].x, vx[u][n].y);
          Mma(acc[n], va[u].z, vb[u].z, va[u].w, vb[u].w, vx[u][n].z, vx[u][n].w);
        }
      }
    }
    const int next = c + kGemvUnroll;
#pragma unroll
    for (int u = 0; u < kGemvUnroll; ++u) {
      if (next + u < c_end) {
        va[u] = LoadStream(wa + (next + u) * 4);
        vb[u] = LoadStream(wb + (next + u) * 4);
      }
    }
  }
  // The next kernel may launch now (its blocks take SM slots only once this
  // one's weights are streamed; H200 batch-1 step 2.90-2.94 -> 2.89 ms).
  asm volatile("griddepcontrol.launch_dependents;");
  float s = SumWarpTiles<kNt, kGemvWarps>(red, acc, tokens);
  const int tok = threadIdx.x >> 4, r = threadIdx.x & 15;
  const int row = row0 + r;
  if constexpr (kTpSum) {
    if (bias != nullptr && row < out) s += Bf16Bits(bias[row]);
    TpSumRows(lines, s, tok, row, min(tokens, 8), out, y);
    return;
  }
  if (tok < tokens && tok < kNt * 8 && row < out) {
    if (bias != nullptr && part == 0) s += Bf16Bits(bias[row]);
    float* dst = y + static_cast<size_t>(tok) * out + row;
    if (split > 1) {
      atomicAdd(dst, s);
    } else {
      *dst = accumulate ? *dst + s : s;
    }
  }
  if constexpr (kTopK) RankAfterLastBlock(topk, tokens, out, y);
}

// Inputs that are not a multiple of 32: one warp per (row, token), plain FMA.
__global__ void GemvScalarKernel(const uint16_t* __restrict__ x, const uint16_t* __restrict__ w,
                                 const uint16_t* __restrict__ bias, int tokens, int in, int out,
                                 bool accumulate, float* __restrict__ y) {
  const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= out) return;
  const uint16_t* wr = w + static_cast<size_t>(row) * in;
  for (int t = 0; t < tokens; ++t) {
    const uint16_t* xr = x + static_cast<size_t>(t) * in;
    float s = 0.0f;
    for (int i = lane; i < in; i += 32) {
      s += __uint_as_float(static_cast<uint32_t>(wr[i]) << 16) *
           __uint_as_float(static_cast<uint32_t>(xr[i]) << 16);
    }
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) {
      if (bias != nullptr) s += __uint_as_float(static_cast<uint32_t>(bias[row]) << 16);
      float* dst = y + static_cast<size_t>(t) * out + row;
      *dst = accumulate ? *dst + s : s;
    }
  }
}

__global__ void BiasToF32Kernel(const uint16_t* __restrict__ bias, int n, float* __restrict__ out) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = __uint_as_float(static_cast<uint32_t>(bias[i]) << 16);
}

// y[t, o] = (accumulate ? y[t, o] : 0) + bias[o], before a matmul with beta = 1
// (the cuBLASLt path when the bias epilogue is refused).
__global__ void PrefillBiasKernel(const uint16_t* __restrict__ bias, int tokens, int out,
                                  bool accumulate, float* __restrict__ y) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < static_cast<size_t>(tokens) * out) {
    const float b = __uint_as_float(static_cast<uint32_t>(bias[i % out]) << 16);
    y[i] = accumulate ? y[i] + b : b;
  }
}

// Blocks of input each block takes (split-K) for an accumulating GEMV:
// enough blocks for 3 per SM, each with at least one slice per warp.
int SplitFor(bool accumulate, int tiles, int in, bool deterministic) {
  if (!accumulate || deterministic) return 1;
  // The current device's SMs (an attribute query, cheap and capture-safe).
  int dev = 0, sms = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
    return 1;
  }
  return std::max(1, std::min(3 * sms / tiles, (in / 32) / kGemvWarps));
}

cudaError_t LaunchGemv(const uint16_t* x, const uint16_t* w, const uint16_t* bias, int tokens,
                       int in, int out, bool accumulate, float* y, cudaStream_t stream,
                       bool deterministic) {
  if (in % 32 != 0) {
    const int blocks = (out + 7) / 8;
    GemvScalarKernel<<<blocks, 256, 0, stream>>>(x, w, bias, tokens, in, out, accumulate, y);
    return cudaGetLastError();
  }
  // Launched with programmatic stream serialization (PDL): the blocks start
  // while the previous kernel drains and wait for it inside (griddepcontrol).
  // Accumulating projections with too few row tiles to give every SM its
  // 3 resident blocks split the input over more blocks (their sums meet in
  // y's atomics): the O projection (180 tiles) runs 360 blocks, the router
  // (8 tiles) 88. Each block keeps at least 8 slices (one per warp).
  const int tiles = (out + 15) / 16;
  const dim3 grid(tiles, SplitFor(accumulate, tiles, in, deterministic));
  if (tokens <= 8) {
    return LaunchPdl(GemvMmaKernel<1, false, false>, grid, dim3(kGemvThreads), 0, stream, true, x,
                     nullptr, nullptr, 0.0f, nullptr, w, bias, tokens, in, out, accumulate, y,
                     GemvTopK{}, EpLaunch{});
  }
  return LaunchPdl(GemvMmaKernel<2, false, false>, grid, dim3(kGemvThreads), 0, stream, true, x,
                   nullptr, nullptr, 0.0f, nullptr, w, bias, tokens, in, out, accumulate, y,
                   GemvTopK{}, EpLaunch{});
}

// The cuBLASLt entry points, resolved with dlsym.
struct LtApi {
  void* lib = nullptr;
  decltype(&::cublasLtCreate) create = nullptr;
  decltype(&::cublasLtDestroy) destroy = nullptr;
  decltype(&::cublasLtMatmulDescCreate) desc_create = nullptr;
  decltype(&::cublasLtMatmulDescDestroy) desc_destroy = nullptr;
  decltype(&::cublasLtMatmulDescSetAttribute) desc_set = nullptr;
  decltype(&::cublasLtMatrixLayoutCreate) layout_create = nullptr;
  decltype(&::cublasLtMatrixLayoutDestroy) layout_destroy = nullptr;
  decltype(&::cublasLtMatmulPreferenceCreate) pref_create = nullptr;
  decltype(&::cublasLtMatmulPreferenceDestroy) pref_destroy = nullptr;
  decltype(&::cublasLtMatmulPreferenceSetAttribute) pref_set = nullptr;
  decltype(&::cublasLtMatmulAlgoGetHeuristic) heuristic = nullptr;
  decltype(&::cublasLtMatmul) matmul = nullptr;

  bool Open() {
    lib = dlopen("libcublasLt.so.13", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) lib = dlopen("libcublasLt.so", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) return false;
    bool ok = Sym(&create, "cublasLtCreate") && Sym(&destroy, "cublasLtDestroy") &&
              Sym(&desc_create, "cublasLtMatmulDescCreate") &&
              Sym(&desc_destroy, "cublasLtMatmulDescDestroy") &&
              Sym(&desc_set, "cublasLtMatmulDescSetAttribute") &&
              Sym(&layout_create, "cublasLtMatrixLayoutCreate") &&
              Sym(&layout_destroy, "cublasLtMatrixLayoutDestroy") &&
              Sym(&pref_create, "cublasLtMatmulPreferenceCreate") &&
              Sym(&pref_destroy, "cublasLtMatmulPreferenceDestroy") &&
              Sym(&pref_set, "cublasLtMatmulPreferenceSetAttribute") &&
              Sym(&heuristic, "cublasLtMatmulAlgoGetHeuristic") && Sym(&matmul, "cublasLtMatmul");
    if (!ok) {
      dlclose(lib);
      lib = nullptr;
    }
    return ok;
  }
  template <typename F>
  bool Sym(F* f, const char* name) {
    *f = reinterpret_cast<F>(dlsym(lib, name));
    return *f != nullptr;
  }
};

// One prepared matmul: descriptors and the chosen algorithm for a shape.
struct LtPlan {
  int tokens = 0, in = 0, out = 0;
  bool accumulate = false, bias = false;
  // The bias is added by the epilogue (D = A.B + beta C + bias); otherwise it is
  // pre-added into y by a small kernel and beta = 1.
  bool epilogue_bias = false;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

}  // namespace

struct LinearContext {
  LtApi api;
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  float* bias_f32 = nullptr;  // staging for biases not in bias_cache
  // f32 copies of the biases named by CacheLinearBias (and their lengths),
  // by their bf16 address.
  std::unordered_map<const uint16_t*, std::pair<float*, int>> bias_cache;
  std::vector<LtPlan> plans;
  bool deterministic = false;  // SetLinearDeterministic

  ~LinearContext() {
    for (LtPlan& p : plans) {
      if (p.desc != nullptr) api.desc_destroy(p.desc);
      if (p.a != nullptr) api.layout_destroy(p.a);
      if (p.b != nullptr) api.layout_destroy(p.b);
      if (p.d != nullptr) api.layout_destroy(p.d);
    }
    if (handle != nullptr) api.destroy(handle);
    if (api.lib != nullptr) dlclose(api.lib);
    cudaFree(workspace);
    cudaFree(bias_f32);
    for (const auto& [bf16, f32] : bias_cache) cudaFree(f32.first);
  }

  // Descriptors for y^T [out, T] (column-major) = W [in, out]^T . x^T [in, T].
  bool Build(LtPlan* p, bool epilogue_bias) {
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    if (api.desc_create(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) != CUBLAS_STATUS_SUCCESS) {
      return false;
    }
    api.desc_set(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta));
    api.desc_set(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb));
    if (epilogue_bias) {
      const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
      const int32_t bias_type = CUDA_R_32F;
      const float* bias_ptr = bias_f32;
      api.desc_set(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi));
      api.desc_set(p->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type));
      api.desc_set(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias_ptr, sizeof(bias_ptr));
    }
    if (api.layout_create(&p->a, CUDA_R_16BF, p->in, p->out, p->in) != CUBLAS_STATUS_SUCCESS ||
        api.layout_create(&p->b, CUDA_R_16BF, p->in, p->tokens, p->in) != CUBLAS_STATUS_SUCCESS ||
        api.layout_create(&p->d, CUDA_R_32F, p->out, p->tokens, p->out) != CUBLAS_STATUS_SUCCESS) {
      return false;
    }
    cublasLtMatmulPreference_t pref = nullptr;
    if (api.pref_create(&pref) != CUBLAS_STATUS_SUCCESS) return false;
    const size_t ws = kWorkspaceBytes;
    api.pref_set(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t st =
        api.heuristic(handle, p->desc, p->a, p->b, p->d, p->d, pref, 1, &result, &found);
    api.pref_destroy(pref);
    if (st != CUBLAS_STATUS_SUCCESS || found == 0) return false;
    p->algo = result.algo;
    p->epilogue_bias = epilogue_bias;
    return true;
  }

  void Release(LtPlan* p) {
    if (p->desc != nullptr) api.desc_destroy(p->desc);
    if (p->a != nullptr) api.layout_destroy(p->a);
    if (p->b != nullptr) api.layout_destroy(p->b);
    if (p->d != nullptr) api.layout_destroy(p->d);
    p->desc = nullptr;
    p->a = p->b = p->d = nullptr;
  }

  const LtPlan* Plan(int tokens, int in, int out, bool accumulate, bool bias) {
    for (const LtPlan& p : plans) {
      if (p.tokens == tokens && p.in == in && p.out == out && p.accumulate == accumulate &&
          p.bias == bias) {
        return &p;
      }
    }
    LtPlan p;
    p.tokens = tokens, p.in = in, p.out = out, p.accumulate = accumulate, p.bias = bias;
    const bool want_epilogue = bias && out <= kBiasCapacity;
    if (!Build(&p, want_epilogue)) {
      Release(&p);
      if (!want_epilogue || !Build(&p, false)) {
        Release(&p);
        return nullptr;
      }
    }
    plans.push_back(p);
    return &plans.back();
  }
};

cudaError_t CreateLinearContext(LinearContext** ctx) {
  if (ctx == nullptr) return cudaErrorInvalidValue;
  auto* c = new LinearContext;
  cudaError_t err = cudaMalloc(&c->workspace, kWorkspaceBytes);
  if (err == cudaSuccess) err = cudaMalloc(&c->bias_f32, kBiasCapacity * sizeof(float));
  if (err != cudaSuccess) {
    delete c;
    *ctx = nullptr;
    return err;
  }
  if (c->api.Open() && c->api.create(&c->handle) != CUBLAS_STATUS_SUCCESS) c->handle = nullptr;
  *ctx = c;
  return cudaSuccess;
}

void DestroyLinearContext(LinearContext* ctx) { delete ctx; }

bool LinearUsesCublasLt(const LinearContext* ctx) { return ctx != nullptr && ctx->handle != nullptr; }

cudaError_t CacheLinearBias(LinearContext* ctx, const uint16_t* bias, int n, cudaStream_t stream) {
  if (ctx == nullptr || bias == nullptr || n <= 0) return cudaErrorInvalidValue;
  const auto cached = ctx->bias_cache.find(bias);
  if (cached != ctx->bias_cache.end() && cached->second.second >= n) return cudaSuccess;
  float* f32 = nullptr;
  cudaError_t err = cudaMalloc(&f32, static_cast<size_t>(n) * sizeof(float));
  if (err != cudaSuccess) return err;
  BiasToF32Kernel<<<(n + 255) / 256, 256, 0, stream>>>(bias, n, f32);
  err = cudaGetLastError();
  if (err != cudaSuccess) {
    cudaFree(f32);
    return err;
  }
  // A shorter copy is replaced (cudaFree waits for the work that may read it).
  if (cached != ctx->bias_cache.end()) cudaFree(cached->second.first);
  ctx->bias_cache[bias] = {f32, n};
  return cudaSuccess;
}

void SetLinearDeterministic(LinearContext* ctx, bool deterministic) {
  if (ctx != nullptr) ctx->deterministic = deterministic;
}

cudaError_t LaunchLinear(LinearContext* ctx, const uint16_t* x, const uint16_t* w,
                         const uint16_t* bias, int tokens, int in, int out, bool accumulate,
                         float* y, cudaStream_t stream) {
  if (x == nullptr || w == nullptr || y == nullptr || tokens < 0 || in <= 0 || in % 8 != 0 ||
      out <= 0) {
    return cudaErrorInvalidValue;
  }
  if (tokens == 0) return cudaSuccess;
  const bool deterministic = ctx != nullptr && ctx->deterministic;
  if (tokens <= kSmallBatch) {
    return LaunchGemv(x, w, bias, tokens, in, out, accumulate, y, stream, deterministic);
  }

  const LtPlan* plan = nullptr;
  if (ctx != nullptr && ctx->handle != nullptr) {
    plan = ctx->Plan(tokens, in, out, accumulate, bias != nullptr);
  }
  if (plan == nullptr) {
    // No cuBLASLt: the GEMV over 16-token slices (weights re-read per slice).
    for (int t0 = 0; t0 < tokens; t0 += kSmallBatch) {
      const int n = tokens - t0 < kSmallBatch ? tokens - t0 : kSmallBatch;
      cudaError_t err =
          LaunchGemv(x + static_cast<size_t>(t0) * in, w, bias, n, in, out, accumulate,
                     y + static_cast<size_t>(t0) * out, stream, deterministic);
      if (err != cudaSuccess) return err;
    }
    return cudaSuccess;
  }
  float beta = accumulate ? 1.0f : 0.0f;
  if (bias != nullptr) {
    if (plan->epilogue_bias) {
      // The plan's descriptor is shared by every projection of its shape: it
      // is pointed at this one's f32 bias, converted once if cached.
      // (A cached copy shorter than `out` is not used.)
      const auto cached = ctx->bias_cache.find(bias);
      const float* bias_ptr = ctx->bias_f32;
      if (cached != ctx->bias_cache.end() && cached->second.second >= out) {
        bias_ptr = cached->second.first;
      } else {
        BiasToF32Kernel<<<(out + 255) / 256, 256, 0, stream>>>(bias, out, ctx->bias_f32);
      }
      ctx->api.desc_set(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias_ptr, sizeof(bias_ptr));
    } else {
      const size_t n = static_cast<size_t>(tokens) * out;
      PrefillBiasKernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(
          bias, tokens, out, accumulate, y);
      beta = 1.0f;
    }
    if (cudaError_t err = cudaGetLastError(); err != cudaSuccess) return err;
  }
  const float alpha = 1.0f;
  const cublasStatus_t st =
      ctx->api.matmul(ctx->handle, plan->desc, &alpha, w, plan->a, x, plan->b, &beta, y, plan->d,
                      y, plan->d, &plan->algo, ctx->workspace, kWorkspaceBytes, stream);
  return st == CUBLAS_STATUS_SUCCESS ? cudaSuccess : cudaErrorUnknown;
}

static_assert(kNormLinearMaxTokens <= kRmsMaxTokens, "one n8 tile of tokens");

cudaError_t LaunchNormLinear(const float* x, const uint16_t* norm_weight, float eps,
                             const uint16_t* w, const uint16_t* bias, int tokens, int in, int out,
                             bool accumulate, float* y, uint16_t* t_out, cudaStream_t stream,
                             bool deterministic) {
  if (x == nullptr || norm_weight == nullptr || w == nullptr || y == nullptr || tokens < 0 ||
      tokens > kNormLinearMaxTokens || in <= 0 || in % 32 != 0 || out <= 0) {
    return cudaErrorInvalidValue;
  }
  if (tokens == 0) return cudaSuccess;
  const int tiles = (out + 15) / 16;
  return LaunchPdl(GemvMmaKernel<1, true, false>,
                   dim3(tiles, SplitFor(accumulate, tiles, in, deterministic)), dim3(kGemvThreads),
                   0, stream, true, nullptr, x, norm_weight, eps, t_out, w, bias, tokens, in, out,
                   accumulate, y, GemvTopK{}, EpLaunch{});
}

cudaError_t LaunchNormLinearTopK(const float* x, const uint16_t* norm_weight, float eps,
                                 const uint16_t* w, const uint16_t* bias, int tokens, int in,
                                 int experts, float* logits, uint16_t* t_out, int k, int32_t* ids,
                                 float* weights, unsigned* done, cudaStream_t stream,
                                 bool deterministic, const MoeRouteTargets* route,
                                 bool one_cluster) {
  if (x == nullptr || norm_weight == nullptr || w == nullptr || logits == nullptr ||
      ids == nullptr || weights == nullptr || done == nullptr || tokens < 0 ||
      tokens > kNormLinearMaxTokens || in <= 0 || in % 32 != 0 || experts <= 0 ||
      experts > 32 * kTopKMaxPerLane || k <= 0 || k > kTopKMaxK || k > experts) {
    return cudaErrorInvalidValue;
  }
  if (route != nullptr &&
      (route->experts != experts || experts > kNormLinearTopKRouteMaxExperts ||
       route->count == nullptr || route->offset == nullptr || route->pair_of == nullptr ||
       route->active == nullptr || route->num_active == nullptr || route->done == nullptr ||
       route->xh == nullptr || reinterpret_cast<uintptr_t>(route->xh) % 16 != 0)) {
    return cudaErrorInvalidValue;
  }
  static_assert(kNormLinearTopKRouteMaxExperts <= kGemvThreads, "a thread per expert");
  if (tokens == 0) return cudaSuccess;
  if (one_cluster) {
    const cudaError_t err = LaunchRouterCluster(x, norm_weight, eps, w, bias, tokens, in, experts,
                                                t_out, k, ids, weights, route, stream);
    if (err != cudaErrorNotSupported) return err;
  }
  const int tiles = (experts + 15) / 16;
  GemvTopK topk{k, ids, weights, done};
  if (route != nullptr) topk.route = *route;
  return LaunchPdl(GemvMmaKernel<1, true, true>,
                   dim3(tiles, SplitFor(true, tiles, in, deterministic)), dim3(kGemvThreads), 0,
                   stream, true, nullptr, x, norm_weight, eps, t_out, w, bias, tokens, in, experts,
                   true, logits, topk, EpLaunch{});
}

cudaError_t LaunchLinearTpSum(const uint16_t* x, const uint16_t* w, const uint16_t* bias,
                              int tokens, int in, int out, float* residual, const EpLaunch& lines,
                              cudaStream_t stream) {
  if (!LinearTpSumFits(lines, tokens, in, out) || x == nullptr || w == nullptr ||
      residual == nullptr || reinterpret_cast<uintptr_t>(residual) % 8 != 0) {
    return cudaErrorInvalidValue;
  }
  if (tokens == 0) return cudaSuccess;
  return LaunchPdl(GemvMmaKernel<1, false, false, true>, dim3((out + 15) / 16, 1),
                   dim3(kGemvThreads), 0, stream, true, x, nullptr, nullptr, 0.0f, nullptr, w, bias,
                   tokens, in, out, false, residual, GemvTopK{}, lines);
}

bool LinearTpSumFits(const EpLaunch& lines, int tokens, int in, int out) {
  return lines.ipc && lines.self.ll != nullptr && lines.peers != nullptr &&
         lines.shape.tp_size > 1 && lines.state.epochs != nullptr && lines.state.error != nullptr &&
         tokens >= 0 && tokens <= kLinearTpSumMaxTokens && in > 0 && in % 32 == 0 && out > 0 &&
         out % 2 == 0 && static_cast<int64_t>(tokens) * out <= lines.self.ll_count;
}

}  // namespace flotilla::kernels::cuda
