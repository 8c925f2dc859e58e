// Sharded GPU workers against one GPU worker, end to end: `flotilla up
// --device cuda` with 2 and 4 workers (TP 1 and 2; the MoE expert parallel
// over all W ranks or tensor parallel inside each TP group; on a one-GPU
// machine they share the GPU and exchange through CUDA IPC; with a GPU per
// rank the same layouts also run over NCCL) must give the
// greedy tokens of a single worker on both golden fixtures, and prompt
// logits within bf16 tolerance of it on a 120b-wide model of a few layers.
//
// GPU arithmetic is not bit-identical across layouts (the O projection is
// summed over TP ranks, expert outputs are joined in another order), so a
// greedy continuation may part from the single worker's only where the
// single worker's own top two candidates were within kTieLogprob of each
// other; the comparison stops there (the sequences are different from then
// on) and the test reports how many steps matched. The same holds for
// prompt logits: a position whose router tie swung (and later positions
// that attend to it) may differ by more than bf16 rounding.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "kernels/cuda/device.h"
#include "proto/admin.grpc.pb.h"
#include "proto/flotilla.grpc.pb.h"
#include "tests/cluster/cluster_status.h"
#include "tests/cluster/greedy_client.h"
#include "tests/cluster_options.h"
#include "tests/grpc_stub.h"
#include "tools/cli/local_cluster.h"

namespace flotilla {
namespace {
namespace fs = std::filesystem;

constexpr int kGreedyTokens = 24;
// Top-1 minus top-2 logprob below which the single worker's choice is a tie
// that bf16 rounding may swing.
constexpr float kTieLogprob = 0.02f;

std::string EnvOr(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : fallback;
}

struct Layout {
  int workers;
  int tp;
  std::string transport = "auto";  // --device-transport: auto, cuda-ipc or nccl
  std::string moe = "auto";        // --moe-parallel: auto (tp for one TP group), ep or tp
};

std::string Name(const Layout& l) {
  return std::to_string(l.workers) + " workers, TP " + std::to_string(l.tp) + ", " + l.transport +
         ", MoE " + l.moe;
}

class GpuCluster {
 public:
  static std::unique_ptr<GpuCluster> Start(const std::string& model, const Layout& layout) {
    cli::LocalClusterOptions o = testing_util::TestClusterOptions(
        model, layout.workers, layout.tp,
        "cuda-cluster-" + std::to_string(layout.workers) + "x" + std::to_string(layout.tp) + "-" +
            layout.transport + "-" + layout.moe);
    o.device = "cuda";
    o.device_transport = layout.transport;
    o.moe_parallel = layout.moe;
    o.http_listen = "";
    o.bin_dir = EnvOr("FLOTILLA_BIN_DIR", FLOTILLA_BIN_DIR);
    // Several workers share one GPU here: flotilla up gives each its slice of
    // the memory (and of the SMs, under MPS).
    o.gpu_memory_utilization = 0.85;
    o.coordinator_args = {"--max-sequences", "8", "--max-batch-tokens", "512"};
    o.ready_timeout = absl::Seconds(300);
    auto cluster = cli::LocalCluster::Start(o);
    if (!cluster.ok()) {
      ADD_FAILURE() << Name(layout) << ": " << cluster.status() << " (logs in " << o.log_dir
                    << ")";
      return nullptr;
    }
    auto c = std::make_unique<GpuCluster>();
    c->cluster_ = *std::move(cluster);
    c->stub_ = testing_util::PlainStub<v1::Flotilla>(c->cluster_->address());
    return c;
  }

  struct Result {
    std::vector<int32_t> tokens;
    std::vector<float> margins;        // top-1 minus top-2 logprob per token
    std::vector<float> prompt_logits;  // [prompt, vocab] when asked
  };

  Result Generate(const std::vector<int32_t>& prompt, int max_tokens, bool prompt_logits) {
    v1::GenerateRequest req;
    for (int32_t t : prompt) req.mutable_prompt_ids()->add_ids(t);
    req.mutable_sampling()->set_temperature(0);
    req.mutable_sampling()->set_max_tokens(max_tokens);
    req.mutable_sampling()->set_ignore_eos(true);
    req.mutable_sampling()->set_logprobs(2);
    req.set_return_prompt_logits(prompt_logits);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(300));
    auto reader = stub_->Generate(&ctx, req);
    Result r;
    v1::GenerateResponse resp;
    while (reader->Read(&resp)) {
      r.tokens.insert(r.tokens.end(), resp.token_ids().begin(), resp.token_ids().end());
      for (const common::TokenLogprob& lp : resp.logprobs()) {
        r.margins.push_back(lp.top_size() >= 2 ? lp.top(0).logprob() - lp.top(1).logprob()
                                               : 1e9f);
      }
      r.prompt_logits.insert(r.prompt_logits.end(), resp.prompt_logits().begin(),
                             resp.prompt_logits().end());
    }
    grpc::Status status = reader->Finish();
    EXPECT_TRUE(status.ok()) << status.error_message();
    return r;
  }

  void Stop() { cluster_->Stop(); }
  cli::LocalCluster& local() { return *cluster_; }

  admin::ClusterStatus Status() { return testing_util::ClusterStatusAt(cluster_->address()); }

  // A greedy request; returns its final status.
  // `first` (optional) is set when its first tokens arrive.
  grpc::Status Run(const std::vector<int32_t>& prompt, int max_tokens,
                   std::atomic<bool>* first = nullptr) {
    return cluster_test::GreedyGenerate(cluster_->address(), prompt, max_tokens,
                                        {.ignore_eos = true, .first = first})
        .status;
  }

 private:
  std::unique_ptr<cli::LocalCluster> cluster_;
  std::unique_ptr<v1::Flotilla::Stub> stub_;
};

bool HaveGpu() { return kernels::cuda::DeviceCount() > 0; }

// Automatic transport (CUDA IPC on this one node, workers sharing GPUs when
// there are fewer), then NCCL where every rank gets a GPU of its own (NCCL
// allows one rank per GPU).
// Automatic MoE layout: tensor parallel for {2, 2}, expert parallel for the
// others; each layout is also run with the other one.
std::vector<Layout> ShardedLayouts() {
  std::vector<Layout> layouts = {{2, 1}, {2, 2}, {2, 2, "auto", "ep"},
                                 {4, 1}, {4, 2}, {4, 2, "auto", "tp"}};
  for (const Layout& l : {Layout{2, 1, "nccl"}, Layout{2, 2, "nccl"}, Layout{2, 2, "nccl", "ep"},
                          Layout{4, 1, "nccl"}, Layout{4, 2, "nccl"}}) {
    if (l.workers <= kernels::cuda::DeviceCount()) {
      layouts.push_back(l);
    } else {
      std::cout << "not run: " << Name(l) << " (needs " << l.workers << " GPUs)" << std::endl;
    }
  }
  // FLOTILLA_CUDA_CLUSTER_MOE=tp|ep: only the layouts whose MoE layout is that
  // one (auto resolves to tp for one TP group), to check one layout quickly.
  const std::string only = EnvOr("FLOTILLA_CUDA_CLUSTER_MOE", "");
  if (!only.empty()) {
    std::erase_if(layouts, [&](const Layout& l) {
      const std::string moe = l.moe != "auto" ? l.moe : (l.workers == l.tp ? "tp" : "ep");
      return moe != only;
    });
  }
  return layouts;
}

// Compares a sharded continuation with the single worker's: equal tokens up
// to the end, or up to a step where the single worker's choice was a tie.
void ExpectSameGreedy(const GpuCluster::Result& single, const GpuCluster::Result& sharded,
                      const std::string& what) {
  ASSERT_EQ(sharded.tokens.size(), single.tokens.size()) << what;
  ASSERT_EQ(single.margins.size(), single.tokens.size()) << what;
  size_t i = 0;
  while (i < single.tokens.size() && sharded.tokens[i] == single.tokens[i]) ++i;
  if (i < single.tokens.size()) {
    EXPECT_LT(single.margins[i], kTieLogprob)
        << what << ": token " << i << " is " << sharded.tokens[i] << ", the single worker's "
        << single.tokens[i] << " led by " << single.margins[i] << " in logprob";
  }
  std::cout << what << ": " << i << "/" << single.tokens.size() << " greedy tokens equal";
  if (i < single.tokens.size()) std::cout << " (then a tie at " << single.margins[i] << ")";
  std::cout << std::endl;
}

class CudaCluster : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaCluster, ShardedWorkersGiveTheSingleWorkersGreedyTokens) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device: the sharded GPU cluster needs one";
  const fs::path dir = fs::path(EnvOr("FLOTILLA_GOLDEN_DIR", FLOTILLA_GOLDEN_DIR)) / GetParam();
  std::ifstream in(dir / "golden.json");
  ASSERT_TRUE(in) << dir;
  const nlohmann::json golden = nlohmann::json::parse(in);
  std::vector<std::vector<int32_t>> prompts;
  for (const auto& p : golden["prompts"]) prompts.push_back(p.get<std::vector<int32_t>>());

  std::vector<GpuCluster::Result> single;
  {
    auto one = GpuCluster::Start(dir.string(), {1, 1});
    ASSERT_NE(one, nullptr);
    for (const auto& p : prompts) single.push_back(one->Generate(p, kGreedyTokens, false));
    one->Stop();
  }
  for (const Layout& layout : ShardedLayouts()) {
    auto cluster = GpuCluster::Start(dir.string(), layout);
    ASSERT_NE(cluster, nullptr);
    for (size_t i = 0; i < prompts.size(); ++i) {
      ExpectSameGreedy(single[i], cluster->Generate(prompts[i], kGreedyTokens, false),
                       GetParam() + ", " + Name(layout) + ", prompt " + std::to_string(i));
    }
    cluster->Stop();
  }
}

INSTANTIATE_TEST_SUITE_P(Golden, CudaCluster,
                         ::testing::Values(std::string("tiny_e8"),
                                           std::string("tiny_e16_sharded")));

// 120b widths (hidden 2880, 64/8 heads, 128 experts top-4), 3 layers: the
// sharded prompt logits within bf16 tolerance of the single worker's, but
// where a routing tie swung.
constexpr double kLogitTolerance = 0.03;  // x max |logit| of the position
TEST(CudaCluster120b, ShardedPromptLogitsMatchTheSingleWorker) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device: the sharded GPU cluster needs one";
  const std::string model = "synthetic:120b:7:3";
  std::vector<int32_t> prompt;
  for (int i = 0; i < 40; ++i) prompt.push_back((i * 7919 + 13) % 200000);
  GpuCluster::Result single;
  {
    auto one = GpuCluster::Start(model, {1, 1});
    ASSERT_NE(one, nullptr);
    single = one->Generate(prompt, 4, true);
    one->Stop();
  }
  ASSERT_FALSE(single.prompt_logits.empty());
  for (const Layout& layout : ShardedLayouts()) {
    auto cluster = GpuCluster::Start(model, layout);
    ASSERT_NE(cluster, nullptr);
    const GpuCluster::Result r = cluster->Generate(prompt, 4, true);
    cluster->Stop();
    ASSERT_EQ(r.prompt_logits.size(), single.prompt_logits.size()) << Name(layout);
    // Per prompt position: max |difference| against the row's max |logit|.
    const size_t vocab = single.prompt_logits.size() / prompt.size();
    std::vector<double> err(prompt.size());
    for (size_t t = 0; t < prompt.size(); ++t) {
      double scale = 1e-6, diff = 0;
      for (size_t v = 0; v < vocab; ++v) {
        const float a = single.prompt_logits[t * vocab + v], b = r.prompt_logits[t * vocab + v];
        scale = std::max(scale, static_cast<double>(std::fabs(a)));
        diff = std::max(diff, static_cast<double>(std::fabs(a - b)));
      }
      err[t] = diff / scale;
    }
    std::cout << model << ", " << Name(layout) << ": prompt logits vs the single worker, "
              << "max |difference| / max |logit| per position:";
    for (double e : err) std::cout << " " << e;
    std::cout << std::endl;
    // bf16 activations (8 bits of mantissa) through 3 layers keep a position
    // within kLogitTolerance unless a router tie went the other way for it
    // (or for a position it attends to): with 128 random experts per layer
    // that happens to a few positions (measured on an H100: 2 to 5 of 40
    // positions past the tolerance, 0.003 elsewhere before the first one). A
    // real fault in the sharding moves every position.
    std::vector<double> sorted = err;
    std::sort(sorted.begin(), sorted.end());
    const size_t within = static_cast<size_t>(
        std::lower_bound(sorted.begin(), sorted.end(), kLogitTolerance) - sorted.begin());
    EXPECT_GE(within * 4, err.size() * 3) << Name(layout) << ": " << within << " of "
                                          << err.size() << " positions within tolerance";
    EXPECT_LT(sorted[sorted.size() / 2], kLogitTolerance) << Name(layout) << ": median";
  }
}

// Concurrent requests: DP groups run batches of different sizes in the same
// steps (decode graphs of different padded sizes, prefill beside decode), so
// every rank must size its exchanges from the instance's largest step. Each
// request must still give the single worker's greedy tokens (ties allowed).
TEST(CudaClusterConcurrency, ConcurrentRequestsGiveTheSingleWorkersTokens) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device: the sharded GPU cluster needs one";
  const fs::path dir = fs::path(EnvOr("FLOTILLA_GOLDEN_DIR", FLOTILLA_GOLDEN_DIR)) / "tiny_e8";
  std::vector<std::vector<int32_t>> prompts;
  std::vector<int> lengths;
  for (int i = 0; i < 7; ++i) {
    std::vector<int32_t> p;
    for (int j = 0; j < 1 + 9 * i; ++j) p.push_back((i * 131 + j * 17 + 5) % 512);
    prompts.push_back(p);
    lengths.push_back(8 + 5 * i);
  }
  std::vector<GpuCluster::Result> single;
  {
    auto one = GpuCluster::Start(dir.string(), {1, 1});
    ASSERT_NE(one, nullptr);
    for (size_t i = 0; i < prompts.size(); ++i) {
      single.push_back(one->Generate(prompts[i], lengths[i], false));
    }
    one->Stop();
  }
  for (const Layout& layout : {Layout{4, 1}, Layout{4, 2}}) {
    auto cluster = GpuCluster::Start(dir.string(), layout);
    ASSERT_NE(cluster, nullptr);
    std::vector<GpuCluster::Result> got(prompts.size());
    std::vector<std::thread> threads;
    for (size_t i = 0; i < prompts.size(); ++i) {
      threads.emplace_back([&, i] { got[i] = cluster->Generate(prompts[i], lengths[i], false); });
    }
    for (std::thread& t : threads) t.join();
    for (size_t i = 0; i < prompts.size(); ++i) {
      ExpectSameGreedy(single[i], got[i],
                       "concurrent, " + Name(layout) + ", request " + std::to_string(i));
    }
    cluster->Stop();
  }
}

// 120b widths under load: 24 concurrent requests of different lengths on TP
// peers whose decode batches pad to different sizes than their real counts
// (only the leader asks for logits) all finish; every rank's exchanges agree.
TEST(CudaClusterConcurrency, ManyConcurrentRequestsOnTpPeersAllFinish) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device: the sharded GPU cluster needs one";
  auto cluster = GpuCluster::Start("synthetic:120b:7:3", {2, 2});
  ASSERT_NE(cluster, nullptr);
  std::vector<std::thread> threads;
  std::vector<grpc::Status> status(24);
  for (int i = 0; i < 24; ++i) {
    threads.emplace_back([&, i] {
      std::vector<int32_t> prompt;
      for (int j = 0; j < 1 + (i * 7) % 61; ++j) prompt.push_back((i * 977 + j * 31) % 200000);
      status[i] = cluster->Run(prompt, 16 + (i * 5) % 33);
    });
  }
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < 24; ++i) EXPECT_TRUE(status[i].ok()) << i << ": " << status[i].error_message();
  EXPECT_EQ(cluster->Status().state(), admin::READY) << cluster->Status().message();
  cluster->Stop();
}

// Kill -9 of one GPU rank mid-stream: the request ends UNAVAILABLE naming
// the worker, new requests are refused clearly, the restarted worker rejoins
// and the instance serves again.
class CudaClusterFailure : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaClusterFailure, KilledGpuRankFailsClearlyAndRejoins) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device: the sharded GPU cluster needs one";
  if (GetParam() == "nccl" && kernels::cuda::DeviceCount() < 2) {
    GTEST_SKIP() << "nccl needs a GPU per rank: 2 GPUs";
  }
  const fs::path dir = fs::path(EnvOr("FLOTILLA_GOLDEN_DIR", FLOTILLA_GOLDEN_DIR)) / "tiny_e8";
  auto cluster = GpuCluster::Start(dir.string(), {2, 2, GetParam()});
  ASSERT_NE(cluster, nullptr);
  ASSERT_TRUE(cluster->Run({1, 2, 3}, 4).ok());
  grpc::Status inflight;
  std::atomic<bool> first{false};
  std::thread t([&] { inflight = cluster->Run({5, 6, 7}, 100000, &first); });
  while (!first.load()) std::this_thread::sleep_for(std::chrono::milliseconds(5));  // it runs
  ASSERT_TRUE(cluster->local().KillWorker(1).ok());
  t.join();
  EXPECT_EQ(inflight.error_code(), grpc::StatusCode::UNAVAILABLE) << inflight.error_message();
  EXPECT_NE(inflight.error_message().find("worker-1"), std::string::npos)
      << inflight.error_message();
  const grpc::Status refused = cluster->Run({1, 2, 3}, 4);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAVAILABLE) << refused.error_message();

  ASSERT_TRUE(cluster->local().RestartWorker(1).ok());
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (cluster->Status().state() != admin::READY && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  ASSERT_EQ(cluster->Status().state(), admin::READY) << cluster->Status().message();
  EXPECT_TRUE(cluster->Run({1, 2, 3}, 4).ok());
  cluster->Stop();
}

INSTANTIATE_TEST_SUITE_P(Transports, CudaClusterFailure,
                         ::testing::Values(std::string("cuda-ipc"), std::string("nccl")));

}  // namespace
}  // namespace flotilla
