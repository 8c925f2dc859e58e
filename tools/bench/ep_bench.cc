// flotilla_ep_bench: latency of the device ParallelContext's per-layer
// exchange at gpt-oss-120b shapes (hidden 2880 bf16, top-4 of 128 experts,
// uniform routing over contiguous expert blocks): Dispatch, Combine and the
// TP all-reduce of a layer's tokens, for 1 to 256 tokens per rank.
//
// The program starts --world processes of itself (rank r on GPU r % GPUs, so
// a one-GPU machine runs them all on one GPU: start the MPS daemon for
// concurrent kernels, or they time-slice) that bootstrap through files, and
// prints rank 0's JSON line per token count:
//   dispatch_us, combine_us, allreduce_us: medians of stream-ordered ops
//     back to back (each rank's own events; launch gaps included);
//   layer_us: one layer (dispatch + combine [+ all-reduce with TP > 1])
//     replayed from a CUDA graph of 8 layers, the decode path;
//   graph_exchange_us, graph_allreduce_us: dispatch + combine alone, and
//     the all-reduce alone (TP > 1), each from a graph of 8 of them: the
//     ops as the decode step runs them, without launch gaps;
// next to the goal (20 us a layer at 1-8 tokens per rank) and two published
// anchors (pplx-kernels: 41.6 us on 8 H100 at 1 token; DeepEP low-latency:
// 32 us at 16 tokens).
//
//   flotilla_ep_bench --world 4 --transport ipc [--tp 2] [--tokens 1,8,64]
#include <cuda_runtime.h>
#include <signal.h>
#include <sys/prctl.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "comm/file/file_communicator.h"
#include "common/model_config.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/fill.h"
#include "tests/parallel/process_group.h"
#include "worker/parallel/device_context.h"

namespace flotilla::parallel {
namespace {

constexpr int kGraphLayers = 8;

struct Config {
  std::string transport = "auto";
  int world = 2;
  int tp = 1;
  std::vector<int> tokens = {1, 2, 4, 8, 16, 32, 64, 128, 256};
  int hidden = 2880;
  int top_k = 4;
  int experts = 128;
  int iters = 200;
  int replays = 50;
  double timeout_s = 60;
  int limit_s = 300;  // the ranks are killed after this
  bool lines = true;  // small combines as flagged lines
  // Internal: a child process.
  int rank = -1;
  std::string dir;
};

bool Ok(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return true;
  std::fprintf(stderr, "flotilla_ep_bench: %s: %s\n", what, cudaGetErrorString(err));
  return false;
}

bool Ok(const absl::Status& st, const char* what) {
  if (st.ok()) return true;
  std::fprintf(stderr, "flotilla_ep_bench: %s: %s\n", what, st.ToString().c_str());
  return false;
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Device inputs of one token count: x, distinct experts per token, weights.
struct Inputs {
  uint16_t* x = nullptr;
  int32_t* ids = nullptr;
  float* w = nullptr;
  float* y = nullptr;
  ~Inputs() { cudaFree(x), cudaFree(ids), cudaFree(w), cudaFree(y); }
  bool Make(const Config& c, int tokens, int rank) {
    const size_t rows = static_cast<size_t>(std::max(tokens, 1));
    if (!Ok(cudaMalloc(&x, rows * c.hidden * 2), "malloc") ||
        !Ok(cudaMalloc(&ids, rows * c.top_k * 4), "malloc") ||
        !Ok(cudaMalloc(&w, rows * c.top_k * 4), "malloc") ||
        !Ok(cudaMalloc(&y, rows * c.hidden * 4), "malloc")) {
      return false;
    }
    std::mt19937 rng(static_cast<unsigned>(rank * 1000 + tokens));
    std::vector<int32_t> experts(static_cast<size_t>(c.experts)), h_ids;
    for (int e = 0; e < c.experts; ++e) experts[e] = e;
    for (int t = 0; t < tokens; ++t) {
      std::shuffle(experts.begin(), experts.end(), rng);
      h_ids.insert(h_ids.end(), experts.begin(), experts.begin() + c.top_k);
    }
    std::vector<float> h_w(h_ids.size(), 0.25f);
    return Ok(kernels::cuda::LaunchFillBf16(x, rows * c.hidden, rank + 1, 1.f, 0.f, nullptr),
              "fill") &&
           Ok(cudaMemcpy(ids, h_ids.data(), h_ids.size() * 4, cudaMemcpyHostToDevice), "ids") &&
           Ok(cudaMemcpy(w, h_w.data(), h_w.size() * 4, cudaMemcpyHostToDevice), "w") &&
           Ok(cudaDeviceSynchronize(),
              "inputs");  // copies and fill finished before the streams run
  }
};

// Which of a layer's ops to enqueue.
enum class LayerOps { kAll, kExchange, kAllReduce };

// One layer's exchange enqueued on `stream`; events (if given) around each op.
bool Layer(ParallelContext& ctx, const Inputs& in, int tokens, int hidden, cudaStream_t stream,
           cudaEvent_t* marks, LayerOps ops = LayerOps::kAll) {
  if (marks != nullptr) cudaEventRecord(marks[0], stream);
  if (ops != LayerOps::kAllReduce) {
    auto rows = ctx.ep().Dispatch(0, in.x, in.ids, in.w, tokens, stream);
    if (!Ok(rows.status(), "dispatch")) return false;
    if (marks != nullptr) cudaEventRecord(marks[1], stream);
    if (!Ok(ctx.ep().Combine(0, in.y, stream), "combine")) return false;
  }
  if (marks != nullptr) cudaEventRecord(marks[2], stream);
  if (ops != LayerOps::kExchange &&
      !Ok(ctx.tp().AllReduce(in.y, static_cast<int64_t>(tokens) * hidden, stream), "all-reduce")) {
    return false;
  }
  if (marks != nullptr) cudaEventRecord(marks[3], stream);
  return true;
}

// Medians of each op over back-to-back iterations: dispatch, combine, all-reduce.
bool TimeOps(const Config& c, ParallelContext& ctx, const Inputs& in, int tokens,
             cudaStream_t stream, double us[3]) {
  std::vector<cudaEvent_t> events(static_cast<size_t>(c.iters) * 4);
  for (auto& e : events) cudaEventCreate(&e);
  bool ok = true;
  for (int i = 0; i < c.iters && ok; ++i)
    ok = Layer(ctx, in, tokens, c.hidden, stream, &events[i * 4]);
  ok = ok && Ok(cudaStreamSynchronize(stream), "ops");
  std::vector<double> d, m, a;
  for (int i = c.iters / 10; i < c.iters && ok; ++i) {
    float ms[3];
    for (int k = 0; k < 3; ++k)
      cudaEventElapsedTime(&ms[k], events[i * 4 + k], events[i * 4 + k + 1]);
    d.push_back(ms[0] * 1e3), m.push_back(ms[1] * 1e3), a.push_back(ms[2] * 1e3);
  }
  for (auto& e : events) cudaEventDestroy(e);
  us[0] = Median(d), us[1] = Median(m), us[2] = Median(a);
  return ok;
}

// One layer's time (its `ops`) from a CUDA graph of kGraphLayers layers,
// replayed.
bool TimeGraph(const Config& c, ParallelContext& ctx, const Inputs& in, int tokens,
               cudaStream_t stream, double* layer_us, LayerOps ops = LayerOps::kAll) {
  cudaGraph_t graph = nullptr;
  if (!Ok(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "capture"))
    return false;
  bool ok = true;
  for (int l = 0; l < kGraphLayers && ok; ++l)
    ok = Layer(ctx, in, tokens, c.hidden, stream, nullptr, ops);
  ok = Ok(cudaStreamEndCapture(stream, &graph), "end capture") && ok;
  cudaGraphExec_t exec = nullptr;
  ok = ok && Ok(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  cudaEvent_t start, stop;
  cudaEventCreate(&start), cudaEventCreate(&stop);
  for (int i = 0; i < 5 && ok; ++i) ok = Ok(cudaGraphLaunch(exec, stream), "replay");
  cudaEventRecord(start, stream);
  for (int i = 0; i < c.replays && ok; ++i) ok = Ok(cudaGraphLaunch(exec, stream), "replay");
  cudaEventRecord(stop, stream);
  ok = ok && Ok(cudaEventSynchronize(stop), "replays");
  float ms = 0;
  cudaEventElapsedTime(&ms, start, stop);
  *layer_us = ms * 1e3 / (c.replays * kGraphLayers);
  cudaEventDestroy(start), cudaEventDestroy(stop);
  if (exec != nullptr) cudaGraphExecDestroy(exec);
  if (graph != nullptr) cudaGraphDestroy(graph);
  return ok;
}

DeviceTransport TransportNamed(const std::string& name) {
  if (name == "ipc") return DeviceTransport::kCudaIpc;
  if (name == "nccl") return DeviceTransport::kNccl;
  return DeviceTransport::kAuto;
}

int RunRank(const Config& c) {
  auto host = comm::FileCommunicator::Create(c.dir, c.rank, c.world);
  auto config = ParallelConfig::Create(c.world, c.tp, ModelConfig::Gptoss120b());
  auto map = ExpertMap::Contiguous(1, c.experts, c.world);
  if (!Ok(host.status(), "host") || !Ok(config.status(), "config") || !Ok(map.status(), "map")) {
    return 1;
  }
  const int gpus = kernels::cuda::DeviceCount();
  if (gpus == 0) {
    std::printf("{\"bench\":\"ep_exchange\",\"skipped\":\"no CUDA device\"}\n");
    return 0;
  }
  DeviceContextOptions o;
  o.device = c.rank % gpus;
  o.transport = TransportNamed(c.transport);
  o.hidden = c.hidden;
  o.top_k = c.top_k;
  o.max_tokens_per_step = *std::max_element(c.tokens.begin(), c.tokens.end());
  o.timeout = absl::Seconds(c.timeout_s);
  o.flagged_lines = c.lines;
  auto ctx = CreateDeviceContext(*config, *map, c.rank, **host, o);
  if (!ctx.ok()) {
    nlohmann::json j = {{"bench", "ep_exchange"},
                        {"transport", c.transport},
                        {"world", c.world},
                        {"skipped", ctx.status().ToString()}};
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  kernels::cuda::DeviceProps props;
  kernels::cuda::GetDeviceProps(o.device, &props);
  cudaStream_t stream;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  for (int tokens : c.tokens) {
    Inputs in;
    if (!in.Make(c, tokens, c.rank)) return 1;
    (*ctx)->ep().SetStepTokens(tokens);
    double ops[3] = {0, 0, 0}, layer = 0, exchange = 0, allreduce = 0;
    if (!TimeOps(c, **ctx, in, tokens, stream, ops) ||
        !TimeGraph(c, **ctx, in, tokens, stream, &layer) ||
        !TimeGraph(c, **ctx, in, tokens, stream, &exchange, LayerOps::kExchange) ||
        (c.tp > 1 && !TimeGraph(c, **ctx, in, tokens, stream, &allreduce, LayerOps::kAllReduce))) {
      return 1;
    }
    if (!Ok((*ctx)->CheckHealth(), "health")) return 1;
    const bool mps = std::filesystem::exists("/tmp/nvidia-mps/control");
    nlohmann::json j = {
        {"bench", "ep_exchange"},
        {"transport", (*ctx)->backend()},
        {"device", props.name},
        {"gpus_used", std::min(gpus, c.world)},
        {"processes_per_gpu", (c.world + gpus - 1) / gpus},
        {"mps_daemon", mps},
        {"world", c.world},
        {"tp", c.tp},
        {"flagged_lines", c.lines},
        {"tokens_per_rank", tokens},
        {"hidden", c.hidden},
        {"top_k", c.top_k},
        {"experts", c.experts},
        {"dispatch_us", ops[0]},
        {"combine_us", ops[1]},
        {"allreduce_us", c.tp > 1 ? nlohmann::json(ops[2]) : nlohmann::json(nullptr)},
        {"layer_us", layer},
        {"graph_exchange_us", exchange},
        {"graph_allreduce_us", c.tp > 1 ? nlohmann::json(allreduce) : nlohmann::json(nullptr)},
        {"goal_us", tokens <= 8 ? nlohmann::json(20) : nlohmann::json(nullptr)},
        {"anchors",
         "pplx-kernels 41.6 us (8xH100, 1 token); DeepEP low-latency 32 us (16 tokens)"}};
    if (c.rank == 0) std::printf("%s\n", j.dump().c_str());
    std::fflush(stdout);
  }
  cudaStreamDestroy(stream);
  return 0;
}

int RunParent(const Config& c) {
  testing::ProcessGroup group;
  for (int r = 0; r < c.world; ++r) {
    std::vector<std::string> args = {"--transport", c.transport,
                                     "--world",     std::to_string(c.world),
                                     "--tp",        std::to_string(c.tp),
                                     "--rank",      std::to_string(r),
                                     "--dir",       group.dir(),
                                     "--iters",     std::to_string(c.iters),
                                     "--replays",   std::to_string(c.replays),
                                     "--timeout-s", std::to_string(c.timeout_s)};
    args.insert(args.end(), {"--tokens", absl::StrJoin(c.tokens, ",")});
    if (!c.lines) args.push_back("--no-lines");
    if (!group.Start(args)) return 1;
  }
  group.Wait(std::chrono::seconds(c.limit_s));
  int status = 0;
  for (int r = 0; r < c.world; ++r) {
    if (group.rank(r).exit_code != 0) {
      std::fprintf(stderr, "rank %d exited %d:\n%s\n", r, group.rank(r).exit_code,
                   group.rank(r).log.c_str());
      status = 1;
    }
  }
  std::fputs(group.rank(0).log.c_str(), stdout);
  return status;
}

}  // namespace
}  // namespace flotilla::parallel

int main(int argc, char** argv) {
  flotilla::parallel::Config c;
  CLI::App app{"Device ParallelContext exchange latency (JSON lines)"};
  app.add_option("--transport", c.transport)->check(CLI::IsMember({"auto", "ipc", "nccl"}));
  app.add_option("--world", c.world, "ranks (processes)");
  app.add_option("--tp", c.tp, "TP group size (the all-reduce runs when > 1)");
  app.add_option("--tokens", c.tokens, "tokens per rank")->delimiter(',');
  app.add_option("--hidden", c.hidden);
  app.add_option("--top-k", c.top_k);
  app.add_option("--experts", c.experts);
  app.add_option("--iters", c.iters);
  app.add_option("--replays", c.replays);
  app.add_option("--timeout-s", c.timeout_s, "bound of every device wait");
  app.add_option("--limit-s", c.limit_s, "the ranks are killed after this");
  app.add_flag("!--no-lines", c.lines,
               "small combines through the fence and flags instead of flagged lines (to compare)");
  app.add_option("--rank", c.rank)->group("");
  app.add_option("--dir", c.dir)->group("");
  CLI11_PARSE(app, argc, argv);
  if (c.rank < 0) return flotilla::parallel::RunParent(c);
  prctl(PR_SET_PDEATHSIG, SIGKILL);  // a rank never outlives the benchmark
  return flotilla::parallel::RunRank(c);
}
