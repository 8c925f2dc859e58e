// Dense ops on the GPU at gpt-oss-120b shapes: LaunchLinear for the QKV, O,
// router and lm_head projections at several token counts, and LaunchSample
// over the 201088-token vocabulary. One JSON line per case with the hardware
// figures beside it:
//   linear: us per call, GB/s of weights read (each weight byte once), TFLOP/s,
//           hbm_gbs (peak: memory clock x bus width x 2, or --hbm-gbs) and
//           bf16_tflops (dense peak, --bf16-tflops).
//   sample: us per call, GB/s of logits read (one pass), hbm_gbs.
// Timing: a CUDA graph of --launches launches replayed --reps times, timed
// with events (launch overhead excluded); the linear launches rotate over
// enough weight copies to exceed 3x the L2, so the weights come from HBM.
//   ops_cuda_bench [--tokens 1,8,64,256] [--launches 20] [--reps 10]
//                  [--hbm-gbs G] [--bf16-tflops 989]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cuda/ops.h"
#include "kernels/cuda/sampling.h"
#include "tools/bench/bench_fill.cuh"

namespace {

namespace cuda = flotilla::kernels::cuda;

bool Check(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return true;
  std::fprintf(stderr, "ops_cuda_bench: %s: %s\n", what, cudaGetErrorString(err));
  return false;
}

__global__ void FillBf16(uint16_t* p, size_t n, uint32_t seed, float scale) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const uint32_t h = BenchHash(i, seed);
    const float u = static_cast<float>(h >> 8) * (1.0f / 16777216.0f) * 2.0f - 1.0f;
    const uint32_t bits = __float_as_uint(u * scale);
    p[i] = static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
  }
}

__global__ void FillLogits(float* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const uint32_t h = BenchHash(i, seed);
    const float u = static_cast<float>(h >> 8) * (1.0f / 16777216.0f);
    // A broad tail with a few strong candidates.
    p[i] = u * 4.0f + ((h & 0xFFFu) == 0 ? 8.0f : 0.0f);
  }
}

// Times `launches` calls of fn(i) captured into one graph; returns us per call.
template <typename F>
bool TimeGraph(cudaStream_t stream, int launches, int reps, F fn, double* us) {
  cudaGraph_t graph;
  if (!Check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), "capture")) return false;
  for (int i = 0; i < launches; ++i) {
    if (!Check(fn(i), "launch in capture")) {
      cudaStreamEndCapture(stream, &graph);
      return false;
    }
  }
  if (!Check(cudaStreamEndCapture(stream, &graph), "end capture")) return false;
  cudaGraphExec_t exec;
  if (!Check(cudaGraphInstantiate(&exec, graph, 0), "instantiate")) return false;
  float ms = 0;
  const bool ok = Check(GraphMs(stream, exec, reps, &ms), "run graph");
  *us = 1000.0 * ms / (static_cast<double>(launches) * reps);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  return ok;
}

// Times launches * reps direct calls on the stream (no graph): with PDL the
// next projection may start while the previous one drains.
template <typename F>
bool TimeStream(cudaStream_t stream, int launches, int reps, F fn, double* us) {
  float ms = 0;
  const bool ok = Check(EventMs(
                            stream,
                            [&] {
                              for (int i = 0; i < launches; ++i) fn(i);
                            },
                            [&] {
                              for (int r = 0; r < reps; ++r) {
                                for (int i = 0; i < launches; ++i) {
                                  const cudaError_t err = fn(i);
                                  if (err != cudaSuccess) return err;
                                }
                              }
                              return cudaSuccess;
                            },
                            &ms),
                        "run stream");
  *us = 1000.0 * ms / (static_cast<double>(launches) * reps);
  return ok;
}

// Structured outputs' per-step cost on the device: `rows` token masks
// (a bit per token) copied from pinned memory with the step's inputs, then
// LaunchMaskLogits over the logits. Stream-timed (the upload is outside the
// engine's graphs); the roofline is the upload over PCIe plus one write pass
// over the masked rows' logits.
bool BenchTokenMasks(cudaStream_t stream, const cudaDeviceProp& prop, int vocab, int launches,
                     int reps) {
  const int words = (vocab + 31) / 32, capacity = 32;
  float* logits = nullptr;
  uint32_t *masks = nullptr, *masks_host = nullptr;
  int32_t *rows_dev = nullptr, *rows_host = nullptr;
  cudaMalloc(&logits, static_cast<size_t>(capacity) * vocab * 4);
  cudaMalloc(&masks, static_cast<size_t>(capacity) * words * 4);
  cudaMalloc(&rows_dev, (capacity + 1) * 4);
  cudaMallocHost(&masks_host, static_cast<size_t>(capacity) * words * 4);
  cudaMallocHost(&rows_host, (capacity + 1) * 4);
  // About a tenth of the vocabulary allowed, as in a JSON string state.
  for (size_t w = 0; w < static_cast<size_t>(capacity) * words; ++w) {
    masks_host[w] = 0x01010101u << (w % 4);
  }
  bool ok = true;
  for (int rows : {1, 8, 32}) {
    for (int r = 0; r < capacity; ++r) rows_host[r] = r;
    rows_host[capacity] = rows;
    const size_t upload = static_cast<size_t>(rows) * words * 4 + (capacity + 1) * 4;
    auto fn = [&](int) {
      cudaMemcpyAsync(masks, masks_host, static_cast<size_t>(rows) * words * 4,
                      cudaMemcpyHostToDevice, stream);
      cudaMemcpyAsync(rows_dev, rows_host, (capacity + 1) * 4, cudaMemcpyHostToDevice, stream);
      return cuda::LaunchMaskLogits(logits, vocab, rows_dev, masks, rows_dev + capacity, capacity,
                                    stream);
    };
    double us = 0;
    if (!TimeStream(stream, launches, reps, fn, &us)) {
      ok = false;
      break;
    }
    std::printf(
        "{\"bench\":\"token_mask\",\"gpu\":\"%s\",\"rows\":%d,\"vocab\":%d,\"upload_bytes\":%zu,"
        "\"us_per_step\":%.2f,\"logit_bytes_written_max\":%zu}\n",
        prop.name, rows, vocab, upload, us, static_cast<size_t>(rows) * vocab * 4);
    std::fflush(stdout);
  }
  cudaFree(logits);
  cudaFree(masks);
  cudaFree(rows_dev);
  cudaFreeHost(masks_host);
  cudaFreeHost(rows_host);
  return ok;
}

struct Shape {
  const char* name;
  int in, out;
  bool bias;
  bool accumulate;
};

}  // namespace

int main(int argc, char** argv) {
  std::vector<long> token_counts = {1, 8, 64, 256};
  int launches = 20, reps = 10;
  double hbm_gbs = 0, bf16_tflops = 989;
  std::string only;  // "linear", "sample" or "mask": run one part
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    const char* v = argv[i + 1];
    if (a == "--tokens") {
      token_counts = ParseList(v);
    } else if (a == "--launches") {
      launches = std::max(1, std::atoi(v));
    } else if (a == "--reps") {
      reps = std::max(1, std::atoi(v));
    } else if (a == "--hbm-gbs") {
      hbm_gbs = std::atof(v);
    } else if (a == "--only") {
      only = v;
    } else if (a == "--bf16-tflops") {
      bf16_tflops = std::atof(v);
    } else {
      std::fprintf(stderr, "ops_cuda_bench: unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  int dev = 0;
  cudaDeviceProp prop;
  if (!Check(cudaGetDeviceProperties(&prop, dev), "device")) return 1;
  int mem_khz = 0, bus_bits = 0, l2 = 0;
  cudaDeviceGetAttribute(&mem_khz, cudaDevAttrMemoryClockRate, dev);
  cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, dev);
  cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev);
  if (hbm_gbs <= 0) hbm_gbs = 2.0 * mem_khz * 1e3 * (bus_bits / 8.0) / 1e9;
  std::printf(
      "{\"bench\":\"device\",\"gpu\":\"%s\",\"sms\":%d,\"l2_mb\":%.1f,\"hbm_gbs\":%.0f,"
      "\"bf16_tflops\":%.0f}\n",
      prop.name, prop.multiProcessorCount, l2 / 1048576.0, hbm_gbs, bf16_tflops);
  cudaStream_t stream;
  cudaStreamCreate(&stream);
  cuda::LinearContext* ctx = nullptr;
  if (!Check(cuda::CreateLinearContext(&ctx), "linear context")) return 1;
  const char* large_path = cuda::LinearUsesCublasLt(ctx) ? "cublaslt" : "gemv_slices";

  const Shape shapes[] = {{"qkv", 2880, 5120, true, false},
                          {"o", 4096, 2880, false, true},
                          {"router", 2880, 128, true, false},
                          {"lm_head", 2880, 201088, false, false}};
  const long max_tokens = *std::max_element(token_counts.begin(), token_counts.end());
  uint16_t* x = nullptr;
  float* y = nullptr;
  if (!Check(cudaMalloc(&x, static_cast<size_t>(max_tokens) * 4096 * 2), "alloc x")) return 1;
  if (!Check(cudaMalloc(&y, static_cast<size_t>(max_tokens) * 201088 * 4), "alloc y")) return 1;
  FillBf16<<<1024, 256>>>(x, static_cast<size_t>(max_tokens) * 4096, 17, 1.0f);
  for (const Shape& s : shapes) {
    if (only == "sample" || only == "mask") break;
    const size_t w_elems = static_cast<size_t>(s.in) * s.out;
    const size_t w_bytes = w_elems * 2;
    const int copies = static_cast<int>(std::max<size_t>(2, (3ull * l2 + w_bytes - 1) / w_bytes));
    uint16_t* w = nullptr;
    uint16_t* bias = nullptr;
    if (!Check(cudaMalloc(&w, w_bytes * copies), "alloc w")) return 1;
    if (!Check(cudaMalloc(&bias, s.out * 2), "alloc bias")) return 1;
    FillBf16<<<4096, 256>>>(w, w_elems * copies, 3, 0.035f);
    FillBf16<<<256, 256>>>(bias, s.out, 5, 0.1f);
    for (long T : token_counts) {
      auto fn = [&](int i) {
        return cuda::LaunchLinear(ctx, x, w + static_cast<size_t>(i % copies) * w_elems,
                                  s.bias ? bias : nullptr, static_cast<int>(T), s.in, s.out,
                                  s.accumulate, y, stream);
      };
      double us = 0;
      if (!TimeGraph(stream, std::max(launches, copies), reps, fn, &us)) return 1;
      double us_stream = 0;
      if (!TimeStream(stream, std::max(launches, copies), reps, fn, &us_stream)) return 1;
      const double gbs = w_bytes / (us * 1e3);
      const double tflops = 2.0 * T * s.in * s.out / (us * 1e6);
      std::printf(
          "{\"bench\":\"linear\",\"gpu\":\"%s\",\"proj\":\"%s\",\"in\":%d,\"out\":%d,"
          "\"tokens\":%ld,\"path\":\"%s\",\"us\":%.2f,\"weight_gbs\":%.0f,\"hbm_gbs\":%.0f,"
          "\"pct_hbm\":%.1f,\"tflops\":%.2f,\"bf16_tflops\":%.0f,\"weight_copies\":%d,"
          "\"us_stream\":%.2f}\n",
          prop.name, s.name, s.in, s.out, T, T <= 16 ? "gemv_mma" : large_path,
          us, gbs, hbm_gbs, 100.0 * gbs / hbm_gbs, tflops, bf16_tflops, copies, us_stream);
      std::fflush(stdout);
    }
    cudaFree(w);
    cudaFree(bias);
  }

  // Sampling over the gpt-oss vocabulary.
  const int vocab = 201088;
  struct SampleCase {
    const char* name;
    float temperature;
    int top_k;
    float top_p;
    float min_p;
    int top_n;
  };
  const SampleCase cases[] = {{"greedy", 0.0f, 0, 1.0f, 0.0f, 0},
                              {"greedy_top5_logprobs", 0.0f, 0, 1.0f, 0.0f, 5},
                              {"temperature", 1.0f, 0, 1.0f, 0.0f, 0},
                              {"top_k50_top_p0.9", 0.8f, 50, 0.9f, 0.0f, 0},
                              {"top_p0.95", 1.0f, 0, 0.95f, 0.0f, 0},
                              {"min_p0.05", 1.0f, 0, 1.0f, 0.05f, 0}};
  for (int rows : {1, 64}) {
    if (only == "linear" || only == "mask") break;
    float* logits = nullptr;
    cuda::SamplingRow* params = nullptr;
    int32_t *tokens = nullptr, *top_ids = nullptr;
    float *lps = nullptr, *top_lps = nullptr;
    cudaMalloc(&logits, static_cast<size_t>(rows) * vocab * 4);
    cudaMalloc(&params, rows * sizeof(cuda::SamplingRow));
    cudaMalloc(&tokens, rows * 4);
    cudaMalloc(&lps, rows * 4);
    cudaMalloc(&top_ids, rows * 64 * 4);
    cudaMalloc(&top_lps, rows * 64 * 4);
    FillLogits<<<1024, 256>>>(logits, static_cast<size_t>(rows) * vocab, 9);
    const size_t ws_bytes = cuda::SampleWorkspaceBytes(rows, vocab);
    void* ws = nullptr;
    if (ws_bytes > 0) cudaMalloc(&ws, ws_bytes);
    for (const SampleCase& c : cases) {
      std::vector<cuda::SamplingRow> h(rows);
      for (int r = 0; r < rows; ++r) {
        h[r].temperature = c.temperature, h[r].top_k = c.top_k, h[r].top_p = c.top_p;
        h[r].min_p = c.min_p, h[r].seed = 1 + r, h[r].step = 3;
      }
      cudaMemcpy(params, h.data(), rows * sizeof(cuda::SamplingRow), cudaMemcpyHostToDevice);
      auto fn = [&](int) {
        return cuda::LaunchSample(logits, rows, vocab, params, tokens, lps, c.top_n, top_ids,
                                  top_lps, ws, ws_bytes, stream);
      };
      double us = 0;
      if (!TimeGraph(stream, launches, reps, fn, &us)) return 1;
      const double gbs = static_cast<double>(rows) * vocab * 4 / (us * 1e3);
      std::printf(
          "{\"bench\":\"sample\",\"gpu\":\"%s\",\"case\":\"%s\",\"rows\":%d,\"vocab\":%d,"
          "\"us\":%.2f,\"logits_gbs_one_pass\":%.0f,\"hbm_gbs\":%.0f}\n",
          prop.name, c.name, rows, vocab, us, gbs, hbm_gbs);
      std::fflush(stdout);
    }
    cudaFree(logits);
    cudaFree(params);
    cudaFree(tokens);
    cudaFree(lps);
    cudaFree(top_ids);
    cudaFree(top_lps);
    cudaFree(ws);
  }
  if ((only.empty() || only == "mask") && !BenchTokenMasks(stream, prop, vocab, launches, reps)) {
    return 1;
  }
  cuda::DestroyLinearContext(ctx);
  cudaFree(x);
  cudaFree(y);
  cudaStreamDestroy(stream);
  return Check(cudaGetLastError(), "end") ? 0 : 1;
}
