// MoE layer throughput on the GPU at gpt-oss-120b expert shapes (H = I = 2880,
// E = 128, K = 4 by default) with synthetic MXFP4 weights filled on the device.
// One JSON line per token count: time per layer call (routing + gate_up +
// down), GB/s of expert weights actually read (distinct experts touched times
// one expert's bytes), TFLOP/s, and the HBM / peak figures beside them.
//   moe_cuda_bench [--experts E] [--hidden H] [--intermediate I] [--top-k K]
//                  [--tokens 1,8,64,256,4096] [--hbm-gbs 4800] [--iters N]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/cuda/moe.h"

namespace {

using flotilla::kernels::cuda::MoeDeviceWeights;

bool Check(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return true;
  std::fprintf(stderr, "moe_cuda_bench: %s: %s\n", what, cudaGetErrorString(err));
  return false;
}

bool ParseInt(const char* s, long lo, long hi, long* out) {
  char* end = nullptr;
  long v = std::strtol(s, &end, 10);
  if (end == s || *end != '\0' || v < lo || v > hi) return false;
  *out = v;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  long experts = 128, hidden = 2880, intermediate = 2880, top_k = 4, iters = 0, hbm_gbs = 4800;
  std::vector<long> token_counts = {1, 8, 64, 256, 4096};
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "moe_cuda_bench: %s needs a value\n", a.c_str());
      return 2;
    }
    const char* v = argv[++i];
    bool ok = true;
    if (a == "--experts")
      ok = ParseInt(v, 1, 1024, &experts);
    else if (a == "--hidden")
      ok = ParseInt(v, 32, 4096, &hidden);
    else if (a == "--intermediate")
      ok = ParseInt(v, 32, 4096, &intermediate);
    else if (a == "--top-k")
      ok = ParseInt(v, 1, 1024, &top_k);
    else if (a == "--iters")
      ok = ParseInt(v, 1, 100000, &iters);
    else if (a == "--hbm-gbs")
      ok = ParseInt(v, 1, 100000, &hbm_gbs);
    else if (a == "--tokens") {
      token_counts.clear();
      std::stringstream ss(v);
      std::string item;
      while (ok && std::getline(ss, item, ',')) {
        long t = 0;
        ok = ParseInt(item.c_str(), 1, 1 << 20, &t);
        token_counts.push_back(t);
      }
      ok = ok && !token_counts.empty();
    } else {
      std::fprintf(stderr, "moe_cuda_bench: unknown option %s\n", a.c_str());
      return 2;
    }
    if (!ok) {
      std::fprintf(stderr, "moe_cuda_bench: bad value '%s' for %s\n", v, a.c_str());
      return 2;
    }
  }
  if (top_k > experts) {
    std::fprintf(stderr, "moe_cuda_bench: --top-k %ld exceeds --experts %ld\n", top_k, experts);
    return 2;
  }
  int dev_count = 0;
  if (cudaGetDeviceCount(&dev_count) != cudaSuccess || dev_count == 0) {
    std::fprintf(stderr, "moe_cuda_bench: no CUDA device\n");
    return 1;
  }
  cudaDeviceProp prop;
  if (!Check(cudaGetDeviceProperties(&prop, 0), "device properties")) return 1;

  MoeDeviceWeights w;
  if (!Check(flotilla::kernels::cuda::AllocMoeWeights(experts, hidden, intermediate, &w),
             "allocating weights (shape must be multiples of 32, at most 4096)")) {
    return 1;
  }
  if (!Check(flotilla::kernels::cuda::LaunchFillMoeWeightsSynthetic(w, 1, nullptr), "fill")) {
    return 1;
  }
  const double expert_bytes = static_cast<double>(w.ExpertBytes());
  cudaStream_t stream;
  cudaEvent_t start, stop;
  if (!Check(cudaStreamCreate(&stream), "stream") || !Check(cudaEventCreate(&start), "event") ||
      !Check(cudaEventCreate(&stop), "event")) {
    return 1;
  }
  // An L2-sized buffer written between timed calls so each call reads its
  // weights from HBM, as a real decode step (other layers in between) does.
  size_t flush_bytes = static_cast<size_t>(prop.l2CacheSize) * 2;
  void* flush = nullptr;
  if (!Check(cudaMalloc(&flush, flush_bytes), "flush buffer")) return 1;

  std::mt19937 rng(3);
  for (long T : token_counts) {
    const int K = static_cast<int>(top_k);
    std::vector<int32_t> ids;
    std::vector<float> tw;
    std::vector<int> perm(experts);
    for (long t = 0; t < T; ++t) {
      std::iota(perm.begin(), perm.end(), 0);
      for (int k = 0; k < K; ++k) {
        std::uniform_int_distribution<int> pick(k, static_cast<int>(experts) - 1);
        std::swap(perm[k], perm[pick(rng)]);
        ids.push_back(perm[k]);
        tw.push_back(1.0f / K);
      }
    }
    const size_t touched = std::set<int32_t>(ids.begin(), ids.end()).size();
    std::vector<uint16_t> x(T * hidden, 0x3F80);  // bf16 1.0
    uint16_t* d_x = nullptr;
    int32_t* d_ids = nullptr;
    float *d_w = nullptr, *d_out = nullptr;
    void* d_ws = nullptr;
    size_t ws = flotilla::kernels::cuda::MoeWorkspaceBytes(w, T, K);
    if (!Check(cudaMalloc(&d_x, x.size() * 2), "alloc") ||
        !Check(cudaMalloc(&d_ids, ids.size() * 4), "alloc") ||
        !Check(cudaMalloc(&d_w, tw.size() * 4), "alloc") ||
        !Check(cudaMalloc(&d_out, T * hidden * 4), "alloc") ||
        !Check(cudaMalloc(&d_ws, ws), "alloc") ||
        !Check(cudaMemcpy(d_x, x.data(), x.size() * 2, cudaMemcpyHostToDevice), "copy") ||
        !Check(cudaMemcpy(d_ids, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice), "copy") ||
        !Check(cudaMemcpy(d_w, tw.data(), tw.size() * 4, cudaMemcpyHostToDevice), "copy") ||
        !Check(cudaMemset(d_out, 0, T * hidden * 4), "memset")) {
      return 1;
    }
    auto call = [&] {
      return flotilla::kernels::cuda::LaunchMoeLayer(w, d_x, d_ids, d_w, T, K, 7.0f, 1.702f, d_out,
                                                     d_ws, ws, nullptr, stream);
    };
    if (!Check(call(), "warm-up") || !Check(cudaStreamSynchronize(stream), "warm-up")) return 1;
    const long n = iters > 0 ? iters : (T >= 1024 ? 5 : 50);
    float total_ms = 0;
    for (long i = 0; i < n; ++i) {
      cudaMemsetAsync(flush, i & 0xFF, flush_bytes, stream);
      cudaEventRecord(start, stream);
      if (!Check(call(), "launch")) return 1;
      cudaEventRecord(stop, stream);
      if (!Check(cudaEventSynchronize(stop), "run")) return 1;
      float ms = 0;
      cudaEventElapsedTime(&ms, start, stop);
      total_ms += ms;
    }
    const double sec = total_ms / 1e3 / n;
    const double bytes = touched * expert_bytes;
    const double flops = 2.0 * T * K * (3.0 * hidden * intermediate);
    const double gbs = bytes / sec / 1e9;
    std::printf(
        "{\"bench\":\"moe_cuda\",\"device\":\"%s\",\"tokens\":%ld,\"top_k\":%d,\"experts\":%ld,"
        "\"hidden\":%ld,\"intermediate\":%ld,\"experts_touched\":%zu,\"time_us\":%.2f,"
        "\"weight_bytes\":%.0f,\"weight_gbs\":%.1f,\"hbm_gbs\":%ld,\"hbm_fraction\":%.3f,"
        "\"tflops\":%.3f,\"iters\":%ld}\n",
        prop.name, T, K, experts, hidden, intermediate, touched, sec * 1e6, bytes, gbs, hbm_gbs,
        gbs / hbm_gbs, flops / sec / 1e12, n);
    std::fflush(stdout);
    cudaFree(d_x), cudaFree(d_ids), cudaFree(d_w), cudaFree(d_out), cudaFree(d_ws);
  }
  cudaFree(flush);
  flotilla::kernels::cuda::FreeMoeWeights(&w);
  return 0;
}
