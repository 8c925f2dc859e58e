// The router of a few tokens as one thread-block cluster (router.h).
//
// A batch-1 step runs the router between the O projection and the MoE, on
// the dependency chain: every microsecond after the O projection ends is a
// microsecond of the step. The grid-wide form (linear.cu, GemvMmaKernel's
// kTopK) spreads 0.7 MB of weights over ~90 blocks whose partial logits meet
// in float atomics, then the last block to take a ticket ranks them: three
// dependent trips through L2 after the work. Here C <= 16 CTAs of one cluster
// each copy their R <= 16 rows of the weights into shared memory before the
// launch waits for the O projection, so after it only the residual is read:
// each CTA computes the tokens' inverse RMS and normalised rows itself (as the
// grid-wide form's blocks do, with the same rounding), its rows' logits on
// the tensor cores (the same m16n8k16 fragments, k split over the warps in
// the same order, so the sums are the deterministic mode's bits), and stores
// them into the first CTA's shared memory; one cluster barrier later that
// CTA ranks each token (a warp per token) and, if asked, groups the chosen
// pairs for the MoE layer (BuildMoeRoutingFew: a few pairs, no atomics).
//
// Shared memory: the weight rows (8 or 16 of them), then the tokens'
// normalised rows, both bf16 with rows padded to an odd multiple of 64
// bytes, so a quarter warp's 16-byte loads of two rows fall on all 32 banks.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cmath>

#include "kernels/cuda/gemv.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/moe.h"
#include "kernels/cuda/moe_route.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/ptx.cuh"
#include "kernels/cuda/router.h"
#include "kernels/cuda/topk.cuh"

namespace flotilla::kernels::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kRowsWanted = 8;   // rows per CTA while the cluster may grow
constexpr int kMaxRows = 16;     // one m16 tile
constexpr int kMaxCluster = 16;  // non-portable; 8 where the device refuses it
constexpr int kPortableCluster = 8;
constexpr int kMaxVec = 4;  // float4s of a residual row per thread: in <= 4096
// Static shared memory of the kernel, at most: the barrier, the warps' sums,
// rank 0's logits, ids and weights and BuildMoeRoutingFew's flags.
constexpr size_t kStaticBytes = 24 * 1024;

static_assert(kNormLinearMaxTokens <= kRmsMaxTokens, "one n8 tile of tokens");
static_assert(kNormLinearTopKRouteMaxExperts <= kThreads &&
                  kNormLinearMaxTokens * kTopKMaxK <= kThreads,
              "BuildMoeRoutingFew: a thread per expert and per pair");

// Bytes between staged bf16 rows of `in` values (in % 32 == 0, so 64 | 2 in).
__host__ __device__ constexpr size_t RowStride(int in) {
  const size_t bytes = static_cast<size_t>(in) * 2;
  return bytes % 128 == 0 ? bytes + 64 : bytes;
}

struct RouterArgs {
  const float* x;
  const uint16_t* nw;
  float eps;
  const uint16_t* w;
  const uint16_t* bias;
  int tokens;
  int in;
  int experts;
  int rows;  // weight rows per CTA (the last CTAs may have fewer or none)
  uint16_t* t_out;
  int k;
  int32_t* ids;
  float* weights;
  MoeRouteTargets route;  // route.count null: no routing
};

__device__ __forceinline__ uint32_t ClusterRank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}

__device__ __forceinline__ uint32_t ClusterSize() {
  uint32_t n;
  asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(n));
  return n;
}

// Every thread of every CTA of the cluster, once at the start: this CTA has
// begun (its shared memory may be written by the others once they have
// waited for the arrivals, ClusterWaitStarted).
__device__ __forceinline__ void ClusterArriveStarted() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
}

// Every thread, before its first store into another CTA's shared memory:
// every CTA of the cluster has begun.
__device__ __forceinline__ void ClusterWaitStarted() {
  asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory");
}

// Every thread of every CTA of the cluster: shared-memory stores before it
// (this CTA's and remote ones) are visible to all after it.
__device__ __forceinline__ void ClusterSync() {
  asm volatile(
      "barrier.cluster.arrive.release.aligned;\n"
      "barrier.cluster.wait.acquire.aligned;\n" ::
          : "memory");
}

// Stores v at the address `local` has in CTA `rank` of the cluster.
__device__ __forceinline__ void StoreToRank(float* local, uint32_t rank, float v) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
               : "=r"(remote)
               : "r"(ptx::SharedAddress(local)), "r"(rank));
  asm volatile("st.shared::cluster.f32 [%0], %1;" ::"r"(remote), "f"(v) : "memory");
}

// A contiguous global -> shared copy completing on `bar` (16-byte aligned
// ends, a multiple of 16 bytes).
__device__ __forceinline__ void BulkCopy(void* dst, const void* src, uint32_t bytes,
                                         uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
          "r"(ptx::SharedAddress(dst)),
      "l"(src), "r"(bytes), "r"(ptx::SharedAddress(bar))
      : "memory");
}

// The tokens' normalised rows, bf16(nw * (x * inv)), into x_s from the
// float4s this thread read for their inverse RMS (held) and the norm
// weights it read before the wait (nw: 4 values per float4).
template <int kVec>
__device__ __forceinline__ void NormaliseHeld(const RouterArgs& a, const float* inv,
                                              const float4 (&held)[kRmsMaxTokens][kVec],
                                              const uint2 (&nw)[kVec], uint8_t* x_s,
                                              size_t stride) {
  const int h4 = a.in / 4;
#pragma unroll
  for (int t = 0; t < kRmsMaxTokens; ++t) {
    if (t >= a.tokens) break;
    const float s = inv[t];
#pragma unroll
    for (int m = 0; m < kVec; ++m) {
      const int i = threadIdx.x + m * kThreads;
      if (i < h4) {
        const float4 v = held[t][m];
        *reinterpret_cast<uint2*>(x_s + t * stride + 8 * i) =
            make_uint2(NormPair(v.x, v.y, nw[m].x, s), NormPair(v.z, v.w, nw[m].y, s));
      }
    }
  }
}

// This CTA's share of the normalised rows (16-byte words) from x_s to t_out
// and, as the MoE's f16 x, to route.xh.
__device__ __forceinline__ void WriteRowShare(const RouterArgs& a, const uint8_t* x_s,
                                              size_t stride, uint32_t rank, uint32_t ranks) {
  if (a.t_out == nullptr && a.route.xh == nullptr) return;
  const int groups = a.in / 8;
  const int lo = static_cast<int>(rank * groups / ranks);
  const int n = static_cast<int>((rank + 1) * groups / ranks) - lo;
  for (int i = threadIdx.x; i < a.tokens * n; i += kThreads) {
    const int t = i / n, j = lo + (i - t * n);
    const uint4 v = *reinterpret_cast<const uint4*>(x_s + t * stride + 16 * j);
    const size_t at = static_cast<size_t>(t) * a.in + 8 * j;
    if (a.t_out != nullptr) *reinterpret_cast<uint4*>(a.t_out + at) = v;
    if (a.route.xh != nullptr) *reinterpret_cast<uint4*>(a.route.xh + at) = Bf16x8ToMoeHalves(v);
  }
}

// This warp's share of the CTA's 16-row x 8-token tile of logits, k split
// over the warps as GemvMmaKernel splits it (kTwoHalves: rows 8-15 too).
template <bool kTwoHalves>
__device__ __forceinline__ void WarpLogits(const RouterArgs& a, const uint8_t* w_s,
                                           const uint8_t* x_s, size_t stride, float (&acc)[4]) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, q = lane & 3;
  const int chunks = a.in >> 5;
  const int c_begin = warp * chunks / kWarps, c_end = (warp + 1) * chunks / kWarps;
  const uint8_t* wa = w_s + g * stride + 16 * q;
  const uint8_t* wb = w_s + (g + 8) * stride + 16 * q;
  const bool has = g < a.tokens;
  const uint8_t* xv = x_s + (has ? g : 0) * stride + 16 * q;
  const uint4 zero = make_uint4(0, 0, 0, 0);
  for (int c = c_begin; c < c_end; ++c) {
    const uint4 va = *reinterpret_cast<const uint4*>(wa + 64 * c);
    const uint4 vb = kTwoHalves ? *reinterpret_cast<const uint4*>(wb + 64 * c) : zero;
    const uint4 vx = has ? *reinterpret_cast<const uint4*>(xv + 64 * c) : zero;
    Mma(acc, va.x, vb.x, va.y, vb.y, vx.x, vx.y);
    Mma(acc, va.z, vb.z, va.w, vb.w, vx.z, vx.w);
  }
}

template <bool kTwoHalves>
__global__ void __launch_bounds__(kThreads, 1) RouterClusterKernel(const RouterArgs a) {
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ uint64_t bar;
  __shared__ float red[kWarps][16][16 + 1];
  __shared__ float logits[kRmsMaxTokens][kNormLinearTopKRouteMaxExperts];  // rank 0's are used
  __shared__ float part_ss[kWarps][kRmsMaxTokens];
  __shared__ float inv_s[kRmsMaxTokens];
  ClusterArriveStarted();
  const uint32_t rank = ClusterRank(), ranks = ClusterSize();
  const int row0 = static_cast<int>(rank) * a.rows;
  const int rows = max(0, min(a.rows, a.experts - row0));
  const size_t stride = RowStride(a.in);
  const uint32_t row_bytes = static_cast<uint32_t>(a.in) * 2;
  uint8_t* w_s = smem;
  uint8_t* x_s = smem + (kTwoHalves ? 16 : 8) * stride;

  // The weights do not depend on the kernel before: ask for them first, and
  // read this thread's norm weights and bias.
  if (threadIdx.x == 0) {
    ptx::MbarInit(&bar, 1);
    if (rows > 0) {
      ptx::MbarExpectTx(&bar, rows * row_bytes);
      for (int r = 0; r < rows; ++r) {
        BulkCopy(w_s + r * stride, a.w + static_cast<size_t>(row0 + r) * a.in, row_bytes, &bar);
      }
    }
  }
  uint2 nw[kMaxVec];
#pragma unroll
  for (int m = 0; m < kMaxVec; ++m) {
    const int i = threadIdx.x + m * kThreads;
    nw[m] = i < a.in / 4 ? __ldg(reinterpret_cast<const uint2*>(a.nw) + i) : make_uint2(0, 0);
  }
  const int tok = threadIdx.x >> 4, r = threadIdx.x & 15;
  const bool writes = tok < a.tokens && r < rows;
  const float bias = writes && a.bias != nullptr ? Bf16Bits(__ldg(a.bias + row0 + r)) : 0.0f;
  asm volatile("griddepcontrol.wait;" ::: "memory");
  float4 held[kRmsMaxTokens][kMaxVec];
  BlockInverseRmsHeld<kRmsMaxTokens, kThreads, kMaxVec>(a.x, a.tokens, a.in, a.eps, part_ss, inv_s,
                                                        held);
  NormaliseHeld<kMaxVec>(a, inv_s, held, nw, x_s, stride);
  __syncthreads();
  WriteRowShare(a, x_s, stride, rank, ranks);
  float acc[1][4] = {{0.0f, 0.0f, 0.0f, 0.0f}};
  if (rows > 0) {
    ptx::MbarWait(&bar, 0);
    WarpLogits<kTwoHalves>(a, w_s, x_s, stride, acc[0]);
  }
  // The MoE layer's CTAs may take their SM slots now; they wait for this grid.
  asm volatile("griddepcontrol.launch_dependents;");
  const float s = SumWarpTiles<1, kWarps>(red, acc, a.tokens);
  ClusterWaitStarted();  // long since true: the CTAs arrived at their start
  if (writes) {
    const float biased = a.bias != nullptr ? s + bias : s;
    StoreToRank(&logits[tok][row0 + r], 0, 0.0f + biased);  // as accumulating into zeros
  }
  ClusterSync();
  if (rank != 0) return;
  constexpr int kMaxPairs = kRmsMaxTokens * kTopKMaxK;
  __shared__ int32_t s_ids[kMaxPairs];
  __shared__ float s_weights[kMaxPairs];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (warp < a.tokens) {
    float v[kTopKMaxPerLane];
#pragma unroll
    for (int i = 0; i < kTopKMaxPerLane; ++i) {
      const int e = lane + 32 * i;
      v[i] = e < a.experts ? logits[warp][e] : -INFINITY;
    }
    WarpTopKSoftmaxHeld(v, a.experts, a.k, s_ids + warp * a.k, s_weights + warp * a.k);
  }
  __syncthreads();
  const int pairs = a.tokens * a.k;
  if (threadIdx.x < pairs) {
    a.ids[threadIdx.x] = s_ids[threadIdx.x];
    a.weights[threadIdx.x] = s_weights[threadIdx.x];
  }
  if (a.route.count != nullptr) BuildMoeRoutingFew<kMaxPairs>(s_ids, pairs, a.route);
}

// The launch of one cluster of `ranks` CTAs (programmatically dependent when
// `pdl`).
struct ClusterLaunch {
  ClusterLaunch(int ranks, size_t smem, cudaStream_t stream, bool pdl) {
    cfg.gridDim = dim3(ranks);
    cfg.blockDim = dim3(kThreads);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = ranks;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[1].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = pdl ? 2 : 1;
  }
  ClusterLaunch(const ClusterLaunch&) = delete;
  ClusterLaunch& operator=(const ClusterLaunch&) = delete;
  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute attr[2] = {};
};

// The largest cluster this kernel runs on the current device (16, 8 or 0),
// learned once per device with `smem` bytes per CTA.
template <bool kTwoHalves>
int MaxCluster(size_t smem) {
  static PerDevice<int> known;  // 0: not learned; else the size + 1
  std::atomic<int>* slot = known.Current();
  if (slot != nullptr) {
    const int v = slot->load(std::memory_order_relaxed);
    if (v > 0) return v - 1;
  }
  int best = 0;
  for (int size : {kMaxCluster, kPortableCluster}) {
    if (size > kPortableCluster &&
        cudaFuncSetAttribute(RouterClusterKernel<kTwoHalves>,
                             cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess) {
      (void)cudaGetLastError();
      continue;
    }
    const ClusterLaunch launch(size, smem, nullptr, /*pdl=*/false);
    int clusters = 0;
    if (cudaOccupancyMaxActiveClusters(&clusters, RouterClusterKernel<kTwoHalves>, &launch.cfg) ==
            cudaSuccess &&
        clusters > 0) {
      best = size;
      break;
    }
    (void)cudaGetLastError();
  }
  if (slot != nullptr) slot->store(best + 1, std::memory_order_relaxed);
  return best;
}

template <bool kTwoHalves>
cudaError_t Launch(const RouterArgs& a, int ranks, size_t smem, cudaStream_t stream) {
  static PerDevice<size_t> allowed;
  if (cudaError_t err = AllowSharedBytes(RouterClusterKernel<kTwoHalves>, smem, &allowed);
      err != cudaSuccess) {
    return err;
  }
  if (ranks > MaxCluster<kTwoHalves>(smem)) return cudaErrorNotSupported;
  const ClusterLaunch launch(ranks, smem, stream, /*pdl=*/true);
  return cudaLaunchKernelEx(&launch.cfg, RouterClusterKernel<kTwoHalves>, a);
}

}  // namespace

cudaError_t LaunchRouterCluster(const float* x, const uint16_t* norm_weight, float eps,
                                const uint16_t* w, const uint16_t* bias, int tokens, int in,
                                int experts, uint16_t* t_out, int k, int32_t* ids, float* weights,
                                const MoeRouteTargets* route, cudaStream_t stream) {
  if (tokens <= 0 || tokens > kNormLinearMaxTokens || in <= 0 || in % 32 != 0 ||
      in > 4 * kMaxVec * kThreads || experts <= 0 || experts > kNormLinearTopKRouteMaxExperts ||
      k <= 0 || k > kTopKMaxK || k > experts) {
    return cudaErrorNotSupported;
  }
  int device = 0, optin = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) !=
          cudaSuccess) {
    return cudaErrorNotSupported;
  }
  RouterArgs a{x, norm_weight, eps, w, bias, tokens, in, experts, 0, t_out, k, ids, weights, {}};
  if (route != nullptr) a.route = *route;
  // 8 rows per CTA while the cluster may grow, up to 16 in the largest
  // cluster the device runs.
  for (int cluster : {kMaxCluster, kPortableCluster}) {
    const int ranks = std::min(cluster, (experts + kRowsWanted - 1) / kRowsWanted);
    a.rows = (experts + ranks - 1) / ranks;
    if (a.rows > kMaxRows) continue;
    const size_t smem = static_cast<size_t>((a.rows > 8 ? 16 : 8) + tokens) * RowStride(in);
    if (smem + kStaticBytes > static_cast<size_t>(optin)) continue;
    const cudaError_t err =
        a.rows > 8 ? Launch<true>(a, ranks, smem, stream) : Launch<false>(a, ranks, smem, stream);
    if (err != cudaErrorNotSupported) return err;
  }
  return cudaErrorNotSupported;
}

}  // namespace flotilla::kernels::cuda
