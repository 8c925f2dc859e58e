// MoE layer throughput on the GPU at gpt-oss-120b expert shapes (H = I = 2880,
// E = 128, K = 4 by default) with synthetic MXFP4 weights filled on the device.
//
// Honest decode figures: the bench holds several layers' expert weights
// (--layers, 8 by default: ~13.5 GB at 120b shapes) and each timed replay runs
// one MoE call per layer, each layer with its own routing, so a call never
// finds its experts in L2 (50-60 MB) from the call before. The calls are
// captured once into a CUDA graph and the graph's replays are timed with
// events (median), as an engine that replays decode graphs sees them.
//
// One JSON line per (variant, token count): time per layer call (routing +
// gate_up + down), GB/s of expert weights read (distinct experts touched per
// layer times one expert's bytes: blocks + scales + bias), the fraction of the
// HBM peak (memory clock x bus width x 2, or --hbm-gbs), TFLOP/s. A first
// line gives the measured read and copy bandwidth of the card for scale.
//   moe_cuda_bench [--experts E] [--hidden H] [--intermediate I] [--top-k K]
//                  [--tokens 1,8,64,256,4096] [--layers L] [--reps N]
//                  [--variant all|NAME,NAME...] [--hbm-gbs G]
// (variant names: tc tc-no-remainder tc-mma tc-no-tma decode gemm32 gemm64 gemm128 gemm160 tc-plain
// tc-bufs2 tc-bufs3 tc-no-prmt tc-no-pdl tc-unfused tc-fused
//  tc-no-evict tc-split1 tc-split3 fma w4a8 w4a8-copy-only w4a8-math-only w4a8-no-wait
//  w4a8-prep-only; the w4a8 ones only at 1-4 tokens)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <numeric>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/cuda/moe.h"
#include "kernels/cuda/moe_diagnostic.h"
#include "kernels/cuda/moe_w4a8.h"

namespace {

using flotilla::kernels::cuda::kW4a8PrepOnly;
using flotilla::kernels::cuda::kW4a8SkipCopies;
using flotilla::kernels::cuda::kW4a8SkipMath;
using flotilla::kernels::cuda::kW4a8SkipWait;
using flotilla::kernels::cuda::LaunchMoeLayer;
using flotilla::kernels::cuda::LaunchMoeLayerDiagnostic;
using flotilla::kernels::cuda::MoeDeviceWeights;
using flotilla::kernels::cuda::MoeDiagnostic;
using flotilla::kernels::cuda::MoeTuning;

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

// Reads `n` uint4 and folds them so the loads cannot be dropped.
__global__ void ReadKernel(const uint4* p, size_t n, uint32_t* sink) {
  uint32_t acc = 0;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    uint4 v = __ldcs(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678u) *sink = acc;
}

uint16_t FloatToBf16Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7FFF + ((u >> 16) & 1);
  return static_cast<uint16_t>(u >> 16);
}

struct Variant {
  const char* name;
  MoeTuning tuning;
  // copy-only / math-only: the decode kernels' copies or math alone.
  MoeDiagnostic diagnostic = MoeDiagnostic::kNone;
  // The FP8 decode path on re-laid weights (moe_w4a8.h), 1-4 tokens, with
  // the parts in `w4a8_skip` (MoeW4a8Skip) left out.
  bool w4a8 = false;
  unsigned w4a8_skip = 0;
};

MoeTuning Tuned(bool legacy, bool prmt, bool evict, bool pdl, int bufs, int split) {
  MoeTuning t;
  t.legacy_fma = legacy, t.prmt_decode = prmt, t.evict_first = evict, t.pdl = pdl;
  t.tile_buffers = bufs, t.down_split_k = split;
  t.gemm_min_pairs_per_expert = -1;  // the decode kernels at every size
  return t;
}

MoeTuning Gemm(int min_pairs_per_expert, int rows_per_tile) {
  MoeTuning t;
  t.gemm_min_pairs_per_expert = min_pairs_per_expert, t.gemm_rows_per_tile = rows_per_tile;
  return t;
}

// The defaults with one change.
template <typename Change>
MoeTuning With(Change change) {
  MoeTuning t;
  change(t);
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  long experts = 128, hidden = 2880, intermediate = 2880, top_k = 4, layers = 8, reps = 0;
  long hbm_gbs_flag = 0;
  std::string variant_flag = "all";
  std::vector<long> token_counts = {1, 8, 64, 256, 4096};
  // The whole-number flags and their ranges.
  struct NumberFlag {
    const char* name;
    long min, max;
    long* value;
  };
  const NumberFlag numbers[] = {{"--experts", 1, 1024, &experts},
                                {"--hidden", 32, 4096, &hidden},
                                {"--intermediate", 32, 4096, &intermediate},
                                {"--top-k", 1, 1024, &top_k},
                                {"--layers", 1, 64, &layers},
                                {"--reps", 1, 100000, &reps},
                                {"--hbm-gbs", 1, 100000, &hbm_gbs_flag}};
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "moe_cuda_bench: %s needs a value\n", a.c_str());
      return 2;
    }
    const char* v = argv[++i];
    bool ok = true;
    const auto number = std::find_if(std::begin(numbers), std::end(numbers),
                                     [&](const NumberFlag& f) { return a == f.name; });
    if (number != std::end(numbers))
      ok = ParseInt(v, number->min, number->max, number->value);
    else if (a == "--variant")
      variant_flag = v;
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
  std::vector<Variant> variants;
  // tc: the defaults (decode kernels for few pairs per expert, grouped GEMMs
  // for many); tc-no-remainder: experts' last GEMM tiles at full height;
  // tc-mma: the GEMM tiles on mma.sync instead of wgmma; tc-no-tma: the
  // wgmma tiles fed by cp.async; tc-one-stream: the tensor-map GEMMs' big
  // and remainder tiles in one stream;
  // decode / gemm32 / gemm64 / gemm128: one path at every size; tc-plain:
  // none of the decode options; the others leave one default out or change
  // the down split; fma: the CUDA-core baseline.
  const Variant all[] = {
      {"tc", MoeTuning{}},
      {"tc-no-remainder", With([](MoeTuning& t) { t.gemm_remainder_tiles = false; })},
      {"tc-mma", With([](MoeTuning& t) { t.gemm_wgmma = false; })},
      {"tc-no-tma", With([](MoeTuning& t) { t.gemm_tma = false; })},
      {"tc-one-stream", With([](MoeTuning& t) { t.gemm_two_streams = false; })},
      {"decode", Gemm(-1, 0)},
      {"gemm32", Gemm(0, 32)},
      {"gemm64", Gemm(0, 64)},
      {"gemm128", Gemm(0, 128)},
      {"gemm160", Gemm(0, 160)},
      {"tc-plain", Tuned(false, false, false, false, 1, 1)},
      {"tc-bufs2", Tuned(false, true, true, true, 2, 2)},
      {"tc-bufs3", Tuned(false, true, true, true, 3, 2)},
      {"tc-no-prmt", Tuned(false, false, true, true, 1, 2)},
      {"tc-no-pdl", Tuned(false, true, true, false, 1, 2)},
      {"tc-no-evict", Tuned(false, true, false, true, 1, 2)},
      {"tc-split1", Tuned(false, true, true, true, 1, 1)},
      {"tc-split3", Tuned(false, true, true, true, 1, 3)},
      {"copy-only", MoeTuning{}, MoeDiagnostic::kCopyOnly},
      {"copy-only-bufs2", With([](MoeTuning& t) { t.tile_buffers = 2; }), MoeDiagnostic::kCopyOnly},
      {"math-only", MoeTuning{}, MoeDiagnostic::kMathOnly},
      {"tc-unfused", With([](MoeTuning& t) { t.fuse_projections_max_tokens = 0; })},
      {"tc-fused", With([](MoeTuning& t) { t.fuse_projections_max_tokens = 1 << 30; })},
      {"decode-g2",
       With([](MoeTuning& t) { t.gemm_min_pairs_per_expert = -1, t.decode_groups = 2; })},
      {"decode-g4",
       With([](MoeTuning& t) { t.gemm_min_pairs_per_expert = -1, t.decode_groups = 4; })},
      {"fma", Tuned(true, false, false, false, 1, 1)},
      {"w4a8", MoeTuning{}, MoeDiagnostic::kNone, /*w4a8=*/true},
      {"w4a8-copy-only", MoeTuning{}, MoeDiagnostic::kNone, true, kW4a8SkipMath},
      {"w4a8-math-only", MoeTuning{}, MoeDiagnostic::kNone, true, kW4a8SkipCopies},
      {"w4a8-no-wait", MoeTuning{}, MoeDiagnostic::kNone, true, kW4a8SkipWait},
      {"w4a8-prep-only", MoeTuning{}, MoeDiagnostic::kNone, true, kW4a8PrepOnly}};
  std::set<std::string> wanted;
  {
    std::stringstream ss(variant_flag);
    std::string item;
    while (std::getline(ss, item, ',')) wanted.insert(item);
  }
  for (const Variant& v : all) {
    if (wanted.count("all") > 0 || wanted.count(v.name) > 0) variants.push_back(v);
  }
  if (variants.empty() || top_k > experts) {
    std::fprintf(stderr, "moe_cuda_bench: bad --variant or --top-k\n");
    return 2;
  }
  int dev_count = 0;
  if (cudaGetDeviceCount(&dev_count) != cudaSuccess || dev_count == 0) {
    std::fprintf(stderr, "moe_cuda_bench: no CUDA device\n");
    return 1;
  }
  cudaDeviceProp prop;
  if (!Check(cudaGetDeviceProperties(&prop, 0), "device properties")) return 1;
  int mem_khz = 0, bus_bits = 0;
  double hbm_gbs = static_cast<double>(hbm_gbs_flag);
  if (hbm_gbs_flag == 0 &&
      cudaDeviceGetAttribute(&mem_khz, cudaDevAttrMemoryClockRate, 0) == cudaSuccess &&
      cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, 0) == cudaSuccess) {
    hbm_gbs = 2.0 * mem_khz * 1e3 * (bus_bits / 8.0) / 1e9;
  }
  if (hbm_gbs <= 0) hbm_gbs = 4800;

  std::vector<MoeDeviceWeights> w(layers);
  for (long l = 0; l < layers; ++l) {
    if (!Check(flotilla::kernels::cuda::AllocMoeWeights(experts, hidden, intermediate, &w[l]),
               "allocating weights (lower --layers?)") ||
        !Check(flotilla::kernels::cuda::LaunchFillMoeWeightsSynthetic(w[l], 1 + l, nullptr),
               "fill")) {
      return 1;
    }
  }
  const double expert_bytes = static_cast<double>(w[0].ExpertBytes());
  // The re-laid copies for the w4a8 variant, made only when it is asked for.
  std::vector<flotilla::kernels::cuda::MoeW4a8Weights> w8(layers);
  for (const Variant& v : variants) {
    if (!v.w4a8) continue;
    for (long l = 0; l < layers; ++l) {
      if (!Check(flotilla::kernels::cuda::RelayMoeW4a8(w[l], &w8[l], nullptr), "re-layout")) {
        return 1;
      }
    }
    break;
  }
  cudaStream_t stream;
  cudaEvent_t start, stop;
  if (!Check(cudaStreamCreate(&stream), "stream") || !Check(cudaEventCreate(&start), "event") ||
      !Check(cudaEventCreate(&stop), "event") || !Check(cudaDeviceSynchronize(), "fill")) {
    return 1;
  }

  // The card's own ceilings: a read-only stream and a device-to-device copy,
  // both over 1 GiB (several times the L2).
  {
    const size_t bytes = size_t{1} << 30;
    void *a = nullptr, *b = nullptr;
    uint32_t* sink = nullptr;
    if (!Check(cudaMalloc(&a, bytes), "alloc") || !Check(cudaMalloc(&b, bytes), "alloc") ||
        !Check(cudaMalloc(&sink, 4), "alloc") || !Check(cudaMemset(a, 1, bytes), "memset")) {
      return 1;
    }
    float best_read = 1e30f, best_copy = 1e30f;
    for (int i = 0; i < 6; ++i) {
      float ms = 0;
      cudaEventRecord(start, stream);
      ReadKernel<<<prop.multiProcessorCount * 8, 512, 0, stream>>>(static_cast<const uint4*>(a),
                                                                  bytes / 16, sink);
      cudaEventRecord(stop, stream);
      if (!Check(cudaEventSynchronize(stop), "read")) return 1;
      cudaEventElapsedTime(&ms, start, stop);
      best_read = std::min(best_read, ms);
      cudaEventRecord(start, stream);
      cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, stream);
      cudaEventRecord(stop, stream);
      if (!Check(cudaEventSynchronize(stop), "copy")) return 1;
      cudaEventElapsedTime(&ms, start, stop);
      best_copy = std::min(best_copy, ms);
    }
    std::printf(
        "{\"bench\":\"moe_cuda_ceiling\",\"device\":\"%s\",\"sms\":%d,\"l2_mb\":%.1f,"
        "\"hbm_peak_gbs\":%.0f,\"read_gbs\":%.0f,\"copy_gbs_read_plus_write\":%.0f}\n",
        prop.name, prop.multiProcessorCount, prop.l2CacheSize / 1048576.0, hbm_gbs,
        bytes / (best_read / 1e3) / 1e9, 2.0 * bytes / (best_copy / 1e3) / 1e9);
    cudaFree(a), cudaFree(b), cudaFree(sink);
  }

  std::mt19937 rng(3);
  const int K = static_cast<int>(top_k);
  for (long T : token_counts) {
    // Per layer: its own routing (K distinct experts per token, softmax-like
    // weights) and activations; one workspace and output shared by all.
    std::vector<int32_t*> d_ids(layers);
    std::vector<float*> d_tw(layers);
    double touched_total = 0;
    for (long l = 0; l < layers; ++l) {
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
      touched_total += std::set<int32_t>(ids.begin(), ids.end()).size();
      if (!Check(cudaMalloc(&d_ids[l], ids.size() * 4), "alloc") ||
          !Check(cudaMalloc(&d_tw[l], tw.size() * 4), "alloc") ||
          !Check(cudaMemcpy(d_ids[l], ids.data(), ids.size() * 4, cudaMemcpyHostToDevice),
                 "copy") ||
          !Check(cudaMemcpy(d_tw[l], tw.data(), tw.size() * 4, cudaMemcpyHostToDevice), "copy")) {
        return 1;
      }
    }
    std::normal_distribution<float> dist(0.f, 1.f);
    std::vector<uint16_t> x(T * hidden);
    for (auto& v : x) v = FloatToBf16Bits(dist(rng));
    uint16_t* d_x = nullptr;
    float* d_out = nullptr;
    void* d_ws = nullptr;
    const bool w4a8_fits = T <= flotilla::kernels::cuda::kMoeW4a8MaxTokens;
    const size_t ws = std::max(flotilla::kernels::cuda::MoeWorkspaceBytes(w[0], T, K),
                               w8[0].gate_up.slabs != nullptr && w4a8_fits
                                   ? flotilla::kernels::cuda::MoeW4a8WorkspaceBytes(w8[0], T, K)
                                   : size_t{0});
    if (!Check(cudaMalloc(&d_x, x.size() * 2), "alloc") ||
        !Check(cudaMalloc(&d_out, T * hidden * 4), "alloc") ||
        !Check(cudaMalloc(&d_ws, ws), "alloc") ||
        !Check(cudaMemcpy(d_x, x.data(), x.size() * 2, cudaMemcpyHostToDevice), "copy") ||
        !Check(cudaMemset(d_out, 0, T * hidden * 4), "memset")) {
      return 1;
    }
    for (const Variant& var : variants) {
      const bool legacy = var.tuning.legacy_fma;
      if (legacy && T > 256) continue;  // minutes, not news
      if (var.w4a8 && !w4a8_fits) continue;
      auto launch = [&](long l) -> cudaError_t {
        if (var.w4a8 && var.w4a8_skip != 0) {
          return flotilla::kernels::cuda::LaunchMoeW4a8LayerDiagnostic(
              w8[l], d_x, d_ids[l], d_tw[l], T, K, d_out, d_ws, ws, stream, var.w4a8_skip);
        }
        if (var.w4a8) {
          return flotilla::kernels::cuda::LaunchMoeW4a8Layer(
              w8[l], d_x, d_ids[l], d_tw[l], T, K, 7.0f, 1.702f, d_out, d_ws, ws, nullptr, stream);
        }
        if (var.diagnostic != MoeDiagnostic::kNone) {
          return LaunchMoeLayerDiagnostic(w[l], d_x, d_ids[l], d_tw[l], T, K, 7.0f, 1.702f, d_out,
                                          d_ws, ws, stream, var.tuning, var.diagnostic);
        }
        return LaunchMoeLayer(w[l], d_x, d_ids[l], d_tw[l], T, K, 7.0f, 1.702f, d_out, d_ws, ws,
                              nullptr, stream, /*deterministic=*/false, var.tuning);
      };
      auto all_layers = [&]() -> bool {
        for (long l = 0; l < layers; ++l) {
          const cudaError_t launched = launch(l);
          if (!Check(launched, "launch")) {
            return false;
          }
        }
        return true;
      };
      if (!all_layers() || !Check(cudaStreamSynchronize(stream), "warm-up")) return 1;
      cudaGraph_t graph;
      cudaGraphExec_t exec;
      if (!Check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), "capture") ||
          !all_layers() || !Check(cudaStreamEndCapture(stream, &graph), "capture") ||
          !Check(cudaGraphInstantiate(&exec, graph, 0), "instantiate")) {
        return 1;
      }
      const long n = reps > 0 ? reps : (T >= 1024 || (legacy && T > 64) ? 3 : 20);
      std::vector<float> ms(n);
      for (long i = -2; i < n; ++i) {
        cudaEventRecord(start, stream);
        if (!Check(cudaGraphLaunch(exec, stream), "replay")) return 1;
        cudaEventRecord(stop, stream);
        if (!Check(cudaEventSynchronize(stop), "replay")) return 1;
        if (i >= 0) cudaEventElapsedTime(&ms[i], start, stop);
      }
      std::sort(ms.begin(), ms.end());
      const double sec = ms[n / 2] / 1e3 / layers;
      const double bytes = touched_total / layers * expert_bytes;
      const double flops = 2.0 * T * K * (3.0 * hidden * intermediate);
      const double gbs = bytes / sec / 1e9;
      std::printf(
          "{\"bench\":\"moe_cuda\",\"variant\":\"%s\",\"device\":\"%s\",\"tokens\":%ld,"
          "\"top_k\":%d,\"experts\":%ld,\"hidden\":%ld,\"intermediate\":%ld,\"layers\":%ld,"
          "\"experts_touched\":%.1f,\"time_us\":%.2f,\"time_us_min\":%.2f,\"weight_bytes\":%.0f,"
          "\"weight_gbs\":%.1f,\"hbm_peak_gbs\":%.0f,\"hbm_fraction\":%.3f,\"tflops\":%.3f,"
          "\"reps\":%ld}\n",
          var.name, prop.name, T, K, experts, hidden, intermediate, layers, touched_total / layers,
          sec * 1e6, ms[0] * 1e3 / layers, bytes, gbs, hbm_gbs, gbs / hbm_gbs,
          flops / sec / 1e12, n);
      std::fflush(stdout);
      cudaGraphExecDestroy(exec);
      cudaGraphDestroy(graph);
    }
    for (long l = 0; l < layers; ++l) cudaFree(d_ids[l]), cudaFree(d_tw[l]);
    cudaFree(d_x), cudaFree(d_out), cudaFree(d_ws);
  }
  for (auto& lw : w8) flotilla::kernels::cuda::FreeMoeW4a8(&lw);
  for (auto& lw : w) flotilla::kernels::cuda::FreeMoeWeights(&lw);
  return 0;
}
