// Device helpers shared by the CUDA kernels (moe.cu, moe_gemm.cu,
// moe_gemm_ws.cu, attention.cu): shared-memory addresses, 16-byte cp.async
// copies, mbarriers, tensor-map (TMA) copies, ldmatrix,
// the bf16 m16n8k16 tensor-core mma, warpgroup MMA (wgmma) pieces, and a
// block-wide exclusive scan.
// Included by .cu files only.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace flotilla::kernels::cuda::ptx {

__device__ __forceinline__ uint32_t SharedAddress(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared; `src_bytes` 0 fills zeros (rows or blocks past
// the end). There is no L2 cache-hint form on purpose: ptxas 13.0 encoded
// `cp.async.cg ... .L2::cache_hint` with a descriptor register its
// createpolicy had not written, an illegal instruction on an H200
// (kernels/moe_notes.md); bulk copies (cp.async.bulk) take the hint fine.
__device__ __forceinline__ void CpAsync16(void* dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(SharedAddress(dst)),
               "l"(src), "r"(src_bytes)
               : "memory");
}
// The same with a shared-state-space address.
__device__ __forceinline__ void CpAsync16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void CpAsyncCommit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// Four 8x8 b16 matrices: lane l gives the address of row l % 8 of matrix
// l / 8 and receives word l % 4 of row l / 4 of each (transposed: of each
// matrix's transpose).
// mbarriers in shared memory. MbarInit: `count` arrivals complete a phase
// (the init is made visible to the async proxy, so bulk copies may complete
// on it). MbarExpectTx: one arrival that also expects `bytes` of async copies
// to land in this phase. MbarArrive: one arrival (release). MbarWait: spins
// until the phase of parity `parity` has completed (acquire).
__device__ __forceinline__ void MbarInit(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(SharedAddress(bar)), "r"(count)
               : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

__device__ __forceinline__ void MbarExpectTx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(SharedAddress(bar)),
               "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void MbarArrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(SharedAddress(bar)) : "memory");
}

// One arrival once this thread's earlier cp.async copies have landed (the
// arrival is counted in the barrier's init count).
__device__ __forceinline__ void MbarArriveOnCpAsync(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(SharedAddress(bar))
               : "memory");
}

__device__ __forceinline__ void MbarWait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra WAIT_%=;\n"
      "}\n" ::"r"(SharedAddress(bar)),
      "r"(parity)
      : "memory");
}

// A 2D tensor-map (TMA) box copy global -> shared at element coordinates
// (x, y), completing on `bar` (which must expect its bytes). `map` is the
// address of a __grid_constant__ kernel parameter.
__device__ __forceinline__ void TmaLoad2D(void* dst, const void* map, int x, int y, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];" ::"r"(SharedAddress(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(SharedAddress(bar))
      : "memory");
}

__device__ __forceinline__ void LdMatrixX4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SharedAddress(p)));
}
__device__ __forceinline__ void LdMatrixX4Trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SharedAddress(p)));
}

// c (f32) += a (bf16, m16k16 fragment) * b (bf16, k16n8 fragment).
__device__ __forceinline__ void MmaBf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                        uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// c (f32) += a (f16, m16k16 fragment) * b (f16, k16n8 fragment).
__device__ __forceinline__ void MmaF16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                       uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Hopper warpgroup MMA (wgmma): the warpgroup's 4 warps issue it together,
// warp w holding rows 16w..16w+15 of the 64-row A operand (from registers,
// in the mma.sync m16k16 A-fragment layout) and of the f32 accumulators (for
// each 8 columns j, the mma.sync m16n8 C layout: d[j][0..3]).
// SmemDescSw128: the descriptor of a shared-memory B operand stored as rows
// of 128 bytes whose 16-byte chunks are XOR-swizzled by the row's index mod 8
// (the 128-byte swizzle; the tile 1024-byte aligned; 8-row groups 1024 bytes
// apart). K-major (rows along N, each row K contiguous): a k16 step starts 32
// bytes further. MN-major (rows along K, 64 contiguous N values of 16 bits;
// the instruction's transpose flag set): a k16 step starts 2048 bytes further.
__device__ __forceinline__ uint64_t SmemDescSw128(const void* p) {
  const uint64_t addr = static_cast<uint64_t>(SharedAddress(p));
  return ((addr & 0x3FFFFu) >> 4) | (uint64_t{1} << 16) | (uint64_t{1024 >> 4} << 32) |
         (uint64_t{1} << 62);
}
__device__ __forceinline__ void WgmmaFence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void WgmmaCommit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void WgmmaWaitAll() {
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
}

// d (64 x 64, f32) = (accumulate ? d : 0) + a (bf16, registers) * B (bf16,
// `desc`); kTransB: B is MN-major (SmemDescSw128).
template <int kTransB>
__device__ __forceinline__ void WgmmaBf16N64(float (&d)[8][4], const uint32_t (&a)[4],
                                             uint64_t desc, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, "
      "%8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, "
      "%26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
        "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]),
        "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]),
        "+f"(d[7][2]), "+f"(d[7][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(accumulate), "n"(kTransB));
}
// Around a batch of wgmmas (before WgmmaFence and after WgmmaWaitAll): empty
// asm statements that the accumulators and A fragments pass through, so the
// compiler neither sinks their writes past the fence (wgmma would read the
// old values) nor hoists reads of the results above the wait, nor reuses the
// fragments' registers before it.
__device__ __forceinline__ void FenceWgmmaTile(float (&d)[8][4]) {
#pragma unroll
  for (int i = 0; i < 8; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+f"(d[i][j])::"memory");
}
__device__ __forceinline__ void FenceWgmmaFragment(uint32_t (&a)[4]) {
#pragma unroll
  for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(a[j])::"memory");
}

// A counter in global memory that other CTAs of the grid raise: ReleaseAdd
// adds 1 after this thread's earlier writes (release, GPU scope);
// WaitAtLeast spins until it reads `target` or more (acquire, so later reads
// see what the raising CTAs wrote before their add).
__device__ __forceinline__ void ReleaseAdd(int* counter) {
  asm volatile("red.release.gpu.global.add.s32 [%0], 1;" ::"l"(counter) : "memory");
}
__device__ __forceinline__ void WaitAtLeast(const int* counter, int target) {
  for (;;) {
    int v;
    asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(counter) : "memory");
    if (v >= target) return;
    __nanosleep(32);
  }
}

// Exclusive prefix sum of v over the block (blockDim.x a multiple of 32, at
// most 1024); *total (shared or global) receives the sum. warp_sums: 32 ints
// of shared memory, reusable once this returns.
__device__ __forceinline__ int BlockExclusiveScan(int v, int* warp_sums, int* total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int incl = v;
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const int n = __shfl_up_sync(0xFFFFFFFFu, incl, off);
    if (lane >= off) incl += n;
  }
  if (lane == 31) warp_sums[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    const int nw = blockDim.x / 32;
    int s = lane < nw ? warp_sums[lane] : 0;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
      const int n = __shfl_up_sync(0xFFFFFFFFu, s, off);
      if (lane >= off) s += n;
    }
    if (lane < nw) warp_sums[lane] = s;  // inclusive over warps
    if (lane == nw - 1) *total = s;
  }
  __syncthreads();
  const int before = warp > 0 ? warp_sums[warp - 1] : 0;
  const int result = before + incl - v;
  __syncthreads();  // warp_sums may be reused by the caller
  return result;
}

}  // namespace flotilla::kernels::cuda::ptx
