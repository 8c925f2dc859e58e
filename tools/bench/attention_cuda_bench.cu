// Paged attention throughput on the GPU at the gpt-oss layer shape (64 q heads,
// 8 kv heads, head_dim 64, block size 16, shuffled block tables).
// One JSON line per case:
//   decode (1 token per sequence) at contexts 1k, 8k, 32k for batch 1, 8, 64,
//   full attention and sliding window 128: us per call, GB/s of K/V actually
//   read (window-limited), and the HBM bandwidth beside it;
//   prefill of one sequence of 2k, 4k and 8k tokens (causal): TFLOP/s beside the
//   dense bf16 peak.
// Timing: CUDA events around many replays of a CUDA graph; each graph calls the
// kernel on several layers' caches in turn so that the K/V working set exceeds
// 2.5x the L2 and the figures are HBM, not L2.
//   attention_cuda_bench [--hbm-gbs X] [--peak-tflops 989] [--iters N]
//                        [--decode-only BATCH:CONTEXT]  (one full-attention decode case)
//                        [--kv-cache-dtype bf16|fp8]    (fp8: the e4m3 layout of ops.h,
//                                                         K/V bytes counted with the scales)
//                        [--prefill-mma wgmma|mma-sync] (the bf16 prefill's tensor-core path)
//                        [--prefill-only 1]             (skip the decode cases)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/attention.h"
#include "tools/bench/bench_fill.cuh"

namespace {

using flotilla::kernels::cuda::AttentionBatch;
using flotilla::kernels::cuda::PagedKvLayer;

constexpr int kQHeads = 64, kKvHeads = 8, kD = 64, kBlock = 16;

bool Check(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return true;
  std::fprintf(stderr, "attention_cuda_bench: %s: %s\n", what, cudaGetErrorString(err));
  return false;
}

__global__ void FillBf16(uint16_t* x, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const uint32_t h = BenchHash(i, seed);
    // Uniform in about [-1, 1): sign, exponent 126 or 125, 7 mantissa bits.
    x[i] = static_cast<uint16_t>((h & 0x8000u) | ((125u + ((h >> 7) & 1u)) << 7) | (h & 0x7fu));
  }
}

// An FP8 layer's blocks: codes in [-448, 448] (never NaN) and bf16 scales of
// 2^-7 (PagedKvLayer in ops.h).
__global__ void FillFp8(uint8_t* x, size_t n, long long blk_bytes, int scale_off, uint32_t seed) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const long long o = static_cast<long long>(i % blk_bytes);
    if (o < scale_off)
      x[i] = static_cast<uint8_t>(BenchHash(i, seed) & 0xf7u);
    else
      x[i] = (o - scale_off) % 2 == 0 ? 0x00 : 0x3c;
  }
}

struct Setup {
  bool fp8 = false;
  bool prefill_wgmma = true;
  bool prefill_only = false;
  double hbm_gbs = 0;
  double peak_tflops = 989;
  long iters = 0;
  size_t l2_bytes = 0;
  std::string gpu;
};

// Times `layers` launches (one per layer cache) captured in a graph; returns
// microseconds per launch, or a negative value on error.
double TimeCase(const Setup& s, int batch, int ctx, int n_new, int window, int iters) {
  const int blocks_per_seq = (ctx + kBlock - 1) / kBlock;
  const long long fp8_blk_bytes = static_cast<long long>(kKvHeads) * kBlock * (kD + 2);
  const size_t kv_bytes_per_layer =
      static_cast<size_t>(batch) * blocks_per_seq *
      (s.fp8 ? 2 * fp8_blk_bytes : static_cast<long long>(kBlock) * kKvHeads * kD * 2 * 2);
  const int layers = static_cast<int>(std::min<size_t>(
      64, std::max<size_t>(1, (5 * s.l2_bytes / 2 + kv_bytes_per_layer - 1) / kv_bytes_per_layer)));
  const size_t num_blocks = static_cast<size_t>(layers) * batch * blocks_per_seq;
  const size_t block_elems = static_cast<size_t>(kKvHeads) * kBlock * kD;
  uint16_t *k = nullptr, *v = nullptr, *q = nullptr, *out = nullptr;
  uint8_t *k8 = nullptr, *v8 = nullptr;
  int32_t *tables = nullptr, *lens = nullptr, *qstart = nullptr;
  float* sinks = nullptr;
  void* ws = nullptr;
  const int total_q = batch * n_new;
  const size_t kv_elems = s.fp8 ? 8 : num_blocks * block_elems;  // bf16 arrays unused by fp8
  if (s.fp8 && (!Check(cudaMalloc(&k8, num_blocks * fp8_blk_bytes), "alloc k8") ||
                !Check(cudaMalloc(&v8, num_blocks * fp8_blk_bytes), "alloc v8")))
    return -1;
  if (!Check(cudaMalloc(&k, kv_elems * 2), "alloc k") ||
      !Check(cudaMalloc(&v, kv_elems * 2), "alloc v") ||
      !Check(cudaMalloc(&q, static_cast<size_t>(total_q) * kQHeads * kD * 2), "alloc q") ||
      !Check(cudaMalloc(&out, static_cast<size_t>(total_q) * kQHeads * kD * 2), "alloc out") ||
      !Check(cudaMalloc(&tables, num_blocks * 4), "alloc tables") ||
      !Check(cudaMalloc(&lens, batch * 4), "alloc lens") ||
      !Check(cudaMalloc(&qstart, (batch + 1) * 4), "alloc qstart") ||
      !Check(cudaMalloc(&sinks, kQHeads * 4), "alloc sinks"))
    return -1;
  FillBf16<<<1024, 256>>>(k, kv_elems, 1);
  FillBf16<<<1024, 256>>>(v, kv_elems, 2);
  const int scale_off = kKvHeads * kBlock * kD;
  if (s.fp8) {
    FillFp8<<<1024, 256>>>(k8, num_blocks * fp8_blk_bytes, fp8_blk_bytes, scale_off, 4);
    FillFp8<<<1024, 256>>>(v8, num_blocks * fp8_blk_bytes, fp8_blk_bytes, scale_off, 5);
  }
  FillBf16<<<64, 256>>>(q, static_cast<size_t>(total_q) * kQHeads * kD, 3);
  cudaMemset(sinks, 0, kQHeads * 4);
  std::vector<int32_t> ids(num_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), std::mt19937(7));
  cudaMemcpy(tables, ids.data(), num_blocks * 4, cudaMemcpyHostToDevice);
  std::vector<int32_t> hl(batch, ctx), hq(batch + 1);
  for (int b = 0; b <= batch; ++b) hq[b] = b * n_new;
  cudaMemcpy(lens, hl.data(), batch * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(qstart, hq.data(), (batch + 1) * 4, cudaMemcpyHostToDevice);

  AttentionBatch ab;
  ab.max_blocks_per_seq = blocks_per_seq;
  ab.seq_lens = lens;
  ab.q_start = qstart;
  ab.batch = batch;
  ab.total_q = total_q;
  ab.max_seq_len = ctx;
  ab.max_q_per_seq = n_new;
  const size_t ws_bytes = flotilla::kernels::cuda::AttentionWorkspaceBytes(ab, kQHeads, kD);
  if (ws_bytes > 0 && (!Check(cudaMalloc(&ws, ws_bytes), "alloc workspace") ||
                       !Check(cudaMemset(ws, 0, ws_bytes), "zero workspace")))
    return -1;
  PagedKvLayer cache;
  cache.k = k;
  cache.v = v;
  cache.num_blocks = static_cast<int>(num_blocks);
  cache.block_size = kBlock;
  cache.kv_heads = kKvHeads;
  cache.head_dim = kD;
  if (s.fp8) {
    cache.k8 = k8;
    cache.v8 = v8;
    cache.fp8_block_bytes = fp8_blk_bytes;
  }

  cudaStream_t stream;
  cudaStreamCreate(&stream);
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  double us = -1;
  if (Check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "capture")) {
    bool ok = true;
    for (int l = 0; l < layers && ok; ++l) {
      ab.block_tables = tables + static_cast<size_t>(l) * batch * blocks_per_seq;
      ok = Check(
          flotilla::kernels::cuda::LaunchAttention(q, cache, ab, kQHeads, sinks, window, 0.125f,
                                                   out, ws, ws_bytes, stream, s.prefill_wgmma),
          "launch");
    }
    if (Check(cudaStreamEndCapture(stream, &graph), "end capture") && ok &&
        Check(cudaGraphInstantiate(&exec, graph, 0), "instantiate")) {
      float ms = 0;
      if (Check(GraphMs(stream, exec, iters, &ms), "run")) {
        us = ms * 1e3 / (static_cast<double>(iters) * layers);
      }
      cudaGraphExecDestroy(exec);
      cudaGraphDestroy(graph);
    }
  }
  cudaStreamDestroy(stream);
  for (void* x : {static_cast<void*>(k), static_cast<void*>(v), static_cast<void*>(q),
                  static_cast<void*>(out), static_cast<void*>(tables), static_cast<void*>(lens),
                  static_cast<void*>(qstart), static_cast<void*>(sinks), ws, static_cast<void*>(k8),
                  static_cast<void*>(v8)})
    cudaFree(x);
  return us;
}

}  // namespace

int main(int argc, char** argv) {
  Setup s;
  int only_batch = 0, only_ctx = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--hbm-gbs")
      s.hbm_gbs = std::atof(argv[i + 1]);
    else if (a == "--peak-tflops")
      s.peak_tflops = std::atof(argv[i + 1]);
    else if (a == "--iters")
      s.iters = std::atol(argv[i + 1]);
    else if (a == "--kv-cache-dtype" &&
             (std::string(argv[i + 1]) == "fp8" || std::string(argv[i + 1]) == "bf16"))
      s.fp8 = std::string(argv[i + 1]) == "fp8";
    else if (a == "--prefill-mma" &&
             (std::string(argv[i + 1]) == "wgmma" || std::string(argv[i + 1]) == "mma-sync"))
      s.prefill_wgmma = std::string(argv[i + 1]) == "wgmma";
    else if (a == "--prefill-only")
      s.prefill_only = std::atoi(argv[i + 1]) != 0;
    else if (a == "--decode-only" &&
             std::sscanf(argv[i + 1], "%d:%d", &only_batch, &only_ctx) == 2 && only_batch > 0 &&
             only_ctx > 0) {
    } else {
      std::fprintf(stderr,
                   "usage: attention_cuda_bench [--hbm-gbs X] [--peak-tflops X] [--iters N] "
                   "[--decode-only BATCH:CONTEXT] [--kv-cache-dtype bf16|fp8] "
                   "[--prefill-mma wgmma|mma-sync] [--prefill-only 0|1]\n");
      return 2;
    }
  }
  int dev = 0;
  cudaDeviceProp prop;
  if (!Check(cudaGetDevice(&dev), "device") || !Check(cudaGetDeviceProperties(&prop, dev), "props"))
    return 1;
  s.gpu = prop.name;
  int mem_khz = 0, bus_bits = 0, l2 = 0;
  cudaDeviceGetAttribute(&mem_khz, cudaDevAttrMemoryClockRate, dev);
  cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, dev);
  cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev);
  s.l2_bytes = static_cast<size_t>(l2);
  if (s.hbm_gbs <= 0) s.hbm_gbs = 2.0 * mem_khz * 1e3 * (bus_bits / 8.0) / 1e9;

  // One decode case: a JSON line, false on error.
  auto decode_case = [&](int batch, int ctx, int window) {
    const int iters = s.iters > 0 ? static_cast<int>(s.iters) : 20;
    const double us = TimeCase(s, batch, ctx, 1, window, iters);
    if (us < 0) return false;
    const int keys = window > 0 ? std::min(ctx, window) : ctx;
    const double bytes =
        static_cast<double>(batch) * keys * kKvHeads * (s.fp8 ? kD + 2 : kD * 2) * 2;
    const double gbs = bytes / (us * 1e3);
    std::printf(
        "{\"bench\":\"attention_cuda\",\"gpu\":\"%s\",\"mode\":\"decode\",\"kv\":\"%s\","
        "\"batch\":%d,\"context\":%d,\"window\":%d,\"us\":%.2f,\"kv_gbs\":%.1f,"
        "\"hbm_gbs\":%.0f,\"pct_hbm\":%.1f}\n",
        s.gpu.c_str(), s.fp8 ? "fp8" : "bf16", batch, ctx, window, us, gbs, s.hbm_gbs,
        100.0 * gbs / s.hbm_gbs);
    std::fflush(stdout);
    return true;
  };
  if (only_batch > 0) return decode_case(only_batch, only_ctx, 0) ? 0 : 1;
  for (int window : {0, 128})
    for (int ctx : {1024, 8192, 32768})
      for (int batch : {1, 8, 64}) {
        if (s.prefill_only) break;
        if (window > 0 && ctx != 8192) continue;
        if (!decode_case(batch, ctx, window)) return 1;
      }
  for (int window : {0, 128})
    for (int n : {2048, 4096, 8192}) {
      const int iters = s.iters > 0 ? static_cast<int>(s.iters) : 5;
      const double us = TimeCase(s, 1, n, n, window, iters);
      if (us < 0) return 1;
      double pairs = 0;  // (query, key) pairs computed by the causal (windowed) mask
      for (int i = 0; i < n; ++i) pairs += window > 0 ? std::min(i + 1, window) : i + 1;
      const double flops = 4.0 * kD * kQHeads * pairs;
      const double tflops = flops / (us * 1e6);
      std::printf(
          "{\"bench\":\"attention_cuda\",\"gpu\":\"%s\",\"mode\":\"prefill\",\"kv\":\"%s\","
          "\"mma\":\"%s\",\"tokens\":%d,"
          "\"window\":%d,\"us\":%.1f,\"tflops\":%.1f,\"peak_tflops\":%.0f,\"pct_peak\":%.1f}\n",
          s.gpu.c_str(), s.fp8 ? "fp8" : "bf16", s.fp8 || !s.prefill_wgmma ? "mma.sync" : "wgmma",
          n, window, us, tflops, s.peak_tflops, 100.0 * tflops / s.peak_tflops);
      std::fflush(stdout);
    }
  return 0;
}
