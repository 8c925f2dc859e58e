// What one dependent kernel costs on a chain, by how the hand-off is made:
// a graph of --stages kernels, each reading what the one before wrote,
// replayed and timed with events; one JSON line per case, microseconds per
// stage beside the SM clock.
//   plain     launches in stream order;
//   pdl       programmatic dependent launch, every CTA issuing
//             griddepcontrol.launch_dependents (at its start, or with
//             --late: after its work) and griddepcontrol.wait before it reads;
//   counter   PDL with a release counter per stage instead of the wait: each
//             CTA adds 1 after its writes, the next kernel's CTAs acquire it;
//   persistent one kernel with a grid barrier (the same counter) per stage,
//             the floor a kernel spanning the stages would pay.
// Each case runs --ctas-per-sm 1,4,8 x --work 0,2000 (dependent FMAs per
// thread: ~0 and ~4 us of work per stage).
//   launch_chain_bench [--stages 64] [--replays 50] [--ctas-per-sm 1,4,8]
//                      [--work 0,2000]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "tools/bench/bench_fill.cuh"

namespace {

constexpr int kThreads = 256;

enum class Handoff { kPlain, kPdl, kCounter, kPersistent };

const char* Name(Handoff h) {
  switch (h) {
    case Handoff::kPlain:
      return "plain";
    case Handoff::kPdl:
      return "pdl";
    case Handoff::kCounter:
      return "counter";
    case Handoff::kPersistent:
      return "persistent";
  }
  return "?";
}

bool Check(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return true;
  std::fprintf(stderr, "launch_chain_bench: %s: %s\n", what, cudaGetErrorString(err));
  return false;
}

__device__ __forceinline__ unsigned LoadAcquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void AddRelease(unsigned* p) {
  asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(p) : "memory");
}

__device__ __forceinline__ float Work(float v, int work) {
  for (int i = 0; i < work; ++i) v = v * 1.0001f + 0.5f;
  return v;
}

// One stage: every thread reads a value the previous stage wrote (another
// CTA's), works on it and writes its own. Counters: `ready` is the previous
// stage's (wait for `expected` arrivals; 0: the first stage), `done` this one's.
template <Handoff kHandoff>
__global__ void StageKernel(const float* in, float* out, int n, const unsigned* ready,
                            unsigned* done, unsigned expected, int work, bool late) {
  constexpr bool kPdl = kHandoff == Handoff::kPdl || kHandoff == Handoff::kCounter;
  if (kPdl && !late) asm volatile("griddepcontrol.launch_dependents;");
  if constexpr (kHandoff == Handoff::kPdl) asm volatile("griddepcontrol.wait;" ::: "memory");
  if constexpr (kHandoff == Handoff::kCounter) {
    if (threadIdx.x == 0 && expected > 0) {
      while (LoadAcquire(ready) < expected) {
      }
    }
    __syncthreads();
  }
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  const float v = Work(in[(i * 7) % n], work);
  if (kPdl && late) asm volatile("griddepcontrol.launch_dependents;");
  out[i] = v;
  if constexpr (kHandoff == Handoff::kCounter) {
    __syncthreads();
    if (threadIdx.x == 0) AddRelease(done);
  }
}

// All stages in one kernel (every CTA resident: at most what fits at once).
__global__ void PersistentKernel(float* a, float* b, int n, unsigned* barrier, int stages,
                                 int work) {
  float* in = a;
  float* out = b;
  for (int s = 0; s < stages; ++s) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    out[i] = Work(in[(i * 7) % n], work);
    __syncthreads();
    if (threadIdx.x == 0) {
      AddRelease(barrier);
      const unsigned target = static_cast<unsigned>(s + 1) * gridDim.x;
      while (LoadAcquire(barrier) < target) {
      }
    }
    __syncthreads();
    float* t = in;
    in = out;
    out = t;
  }
}

// One stage of a chain made by handoff h (not kPersistent).
cudaError_t LaunchStage(Handoff h, int grid, cudaStream_t stream, const float* in, float* out,
                        int n, const unsigned* ready, unsigned* done, unsigned expected, int work,
                        bool late) {
  auto* kernel = h == Handoff::kPlain ? StageKernel<Handoff::kPlain>
                 : h == Handoff::kPdl ? StageKernel<Handoff::kPdl>
                                      : StageKernel<Handoff::kCounter>;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(grid);
  cfg.blockDim = dim3(kThreads);
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = h == Handoff::kPlain ? 0 : 1;
  return cudaLaunchKernelEx(&cfg, kernel, in, out, n, ready, done, expected, work, late);
}

struct Buffers {
  float* a = nullptr;
  float* b = nullptr;
  unsigned* counters = nullptr;  // one per stage, + 1
};

// Records the chain of `stages` into a graph (counters zeroed first).
cudaError_t Record(Handoff h, int grid, int stages, int work, bool late, const Buffers& buf,
                   cudaStream_t stream, cudaGraph_t* graph) {
  cudaError_t err = cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal);
  if (err != cudaSuccess) return err;
  const int n = grid * kThreads;
  err = cudaMemsetAsync(buf.counters, 0, (stages + 1) * sizeof(unsigned), stream);
  if (h == Handoff::kPersistent && err == cudaSuccess) {
    PersistentKernel<<<grid, kThreads, 0, stream>>>(buf.a, buf.b, n, buf.counters, stages, work);
    err = cudaGetLastError();
  }
  for (int k = 0; h != Handoff::kPersistent && k < stages && err == cudaSuccess; ++k) {
    const float* in = (k & 1) ? buf.b : buf.a;
    float* out = (k & 1) ? buf.a : buf.b;
    const unsigned expected = k == 0 ? 0 : static_cast<unsigned>(grid);
    unsigned* ready = buf.counters + k;
    unsigned* done = buf.counters + k + 1;
    err = LaunchStage(h, grid, stream, in, out, n, ready, done, expected, work, late);
  }
  const cudaError_t ended = cudaStreamEndCapture(stream, graph);
  return err != cudaSuccess ? err : ended;
}

}  // namespace

int main(int argc, char** argv) {
  int stages = 64, replays = 50;
  std::vector<long> per_sm = {1, 4, 8}, works = {0, 2000};
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--stages")) {
      stages = std::atoi(argv[i + 1]);
    } else if (!std::strcmp(argv[i], "--replays")) {
      replays = std::atoi(argv[i + 1]);
    } else if (!std::strcmp(argv[i], "--ctas-per-sm")) {
      per_sm = ParseList(argv[i + 1]);
    } else if (!std::strcmp(argv[i], "--work")) {
      works = ParseList(argv[i + 1]);
    } else {
      std::fprintf(stderr, "launch_chain_bench: unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  if (stages < 1 || replays < 1) {
    std::fprintf(stderr, "launch_chain_bench: --stages and --replays must be positive\n");
    return 2;
  }
  int dev = 0, clock_khz = 0;
  cudaDeviceProp prop;
  if (!Check(cudaGetDevice(&dev), "device") ||
      !Check(cudaGetDeviceProperties(&prop, dev), "props") ||
      !Check(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, dev), "clock")) {
    return 1;
  }
  cudaStream_t stream;
  Buffers buf;
  long max_per_sm = 1;
  for (long p : per_sm) max_per_sm = std::max(max_per_sm, p);
  const size_t floats = static_cast<size_t>(prop.multiProcessorCount) * max_per_sm * kThreads;
  if (!Check(cudaStreamCreate(&stream), "stream") ||
      !Check(cudaMalloc(&buf.a, floats * sizeof(float)), "alloc") ||
      !Check(cudaMalloc(&buf.b, floats * sizeof(float)), "alloc") ||
      !Check(cudaMalloc(&buf.counters, (stages + 1) * sizeof(unsigned)), "alloc") ||
      !Check(cudaMemset(buf.a, 0, floats * sizeof(float)), "memset") ||
      !Check(cudaMemset(buf.b, 0, floats * sizeof(float)), "memset")) {
    return 1;
  }
  for (long p : per_sm) {
    for (long work : works) {
      for (Handoff h : {Handoff::kPlain, Handoff::kPdl, Handoff::kCounter, Handoff::kPersistent}) {
        const bool can_late = h == Handoff::kPdl || h == Handoff::kCounter;
        // The persistent kernel spins at its barrier: every CTA must be resident.
        int resident = 0;
        if (h == Handoff::kPersistent &&
            (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, PersistentKernel, kThreads,
                                                           0) != cudaSuccess ||
             resident < p)) {
          continue;
        }
        for (bool late : {false, true}) {
          if (late && !can_late) continue;
          const int grid = static_cast<int>(prop.multiProcessorCount * p);
          cudaGraph_t graph;
          cudaGraphExec_t exec;
          float ms = 0;
          if (!Check(Record(h, grid, stages, static_cast<int>(work), late, buf, stream, &graph),
                     "record") ||
              !Check(cudaGraphInstantiate(&exec, graph, 0), "instantiate") ||
              !Check(GraphMs(stream, exec, replays, &ms), "replay")) {
            return 1;
          }
          std::printf(
              "{\"bench\":\"launch_chain\",\"gpu\":\"%s\",\"handoff\":\"%s\",\"late_trigger\":%s,"
              "\"ctas_per_sm\":%ld,\"work_fma\":%ld,\"stages\":%d,\"us_per_stage\":%.3f,"
              "\"sm_clock_mhz\":%d}\n",
              prop.name, Name(h), late ? "true" : "false", p, work, stages,
              ms * 1000.0 / replays / stages, clock_khz / 1000);
          cudaGraphExecDestroy(exec);
          cudaGraphDestroy(graph);
        }
      }
    }
  }
  return 0;
}
