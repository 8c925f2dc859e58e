// flotilla_comm_bench: MoE all-to-all latency and bandwidth at decode sizes.
//
// Every rank holds T tokens of `hidden` bf16 values; each token goes to its
// top-k experts (deterministic pseudo-random routing over E experts placed in
// contiguous blocks over the ranks), i.e. one row per (token, expert) pair, as
// in a layer's dispatch; the combine is the same exchange reversed. Prints one
// JSON line per token count with the latency next to the per-token budget:
// a decode step runs 36 layers x 2 all-to-alls within budget_ms_per_token.
//
//   flotilla_comm_bench --backend local --world 4
//   flotilla_comm_bench --backend ucx --world 2      # W separate processes
//
// NCCL between GPUs is a device transport, not a host backend: its exchange
// is measured by flotilla_ep_bench --transport nccl.
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>
#include <vector>

#include "comm/communicator.h"
#include "comm/local/local_communicator.h"
#include "common/status.h"
#if FLOTILLA_BENCH_UCX
#include "comm/ucx/ucx_communicator.h"
#endif

extern char** environ;

namespace flotilla::comm {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr int kLayers = 36;
constexpr int kAllToAllsPerLayer = 2;  // dispatch + combine

struct Config {
  std::string backend = "local";
  int world = 2;
  std::vector<int> tokens = {1, 2, 4, 8, 16, 32, 64, 128, 256};
  int hidden = 2880;
  int topk = 4;
  int experts = 128;
  int iters = 200;
  int warmup = 20;
  double timeout_s = 60;
  double budget_ms_per_token = 1.0;
  bool detect_peer_failure = false;
  // Internal: a UCX child process.
  int rank = -1;
  std::string dir;
};

uint64_t SplitMix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Rows rank `from` sends to each rank for `tokens` tokens.
std::vector<size_t> RowsFrom(const Config& cfg, int from, int tokens) {
  std::vector<size_t> rows(static_cast<size_t>(cfg.world), 0);
  for (int t = 0; t < tokens; ++t) {
    std::vector<int> chosen;
    uint64_t s = SplitMix(static_cast<uint64_t>(from) * 1000003u + static_cast<uint64_t>(t));
    while (static_cast<int>(chosen.size()) < cfg.topk) {
      s = SplitMix(s);
      const int e = static_cast<int>(s % static_cast<uint64_t>(cfg.experts));
      if (std::find(chosen.begin(), chosen.end(), e) == chosen.end()) chosen.push_back(e);
    }
    for (int e : chosen)
      ++rows[static_cast<size_t>(e) * static_cast<size_t>(cfg.world) /
             static_cast<size_t>(cfg.experts)];
  }
  return rows;
}

double Percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())))];
}

// How a rank allocates its buffers (host memory for every backend here).
struct Memory {
  std::function<void*(size_t)> alloc;
  std::function<void(void*)> release;
};

absl::Status RunRank(Communicator& c, const Config& cfg, const Memory& mem,
                     const std::function<absl::Status(void*)>& wait_stream, void* user_stream,
                     const std::string& extra_label) {
  const size_t row_bytes = static_cast<size_t>(cfg.hidden) * 2;
  const int me = c.rank();
  for (int tokens : cfg.tokens) {
    std::vector<size_t> sc(static_cast<size_t>(cfg.world)), rc(sc.size());
    const std::vector<size_t> mine = RowsFrom(cfg, me, tokens);
    size_t send_total = 0, recv_total = 0, offrank = 0;
    for (int p = 0; p < cfg.world; ++p) {
      const size_t q = static_cast<size_t>(p);
      sc[q] = mine[q] * row_bytes;
      rc[q] = RowsFrom(cfg, p, tokens)[static_cast<size_t>(me)] * row_bytes;
      send_total += sc[q];
      recv_total += rc[q];
      if (p != me) offrank += sc[q];
    }
    const std::vector<size_t> so = PackedOffsets(sc), ro = PackedOffsets(rc);
    void* send = mem.alloc(std::max<size_t>(send_total, 1));
    void* recv = mem.alloc(std::max<size_t>(recv_total, 1));
    if (send == nullptr || recv == nullptr)
      return absl::ResourceExhaustedError("buffer allocation failed");

    auto run = [&](int n, std::vector<double>* samples_us, bool exchange_counts) -> absl::Status {
      std::vector<size_t> got_counts, got_offsets;
      for (int i = 0; i < n; ++i) {
        const auto t0 = Clock::now();
        if (exchange_counts) {
          FLOTILLA_RETURN_IF_ERROR(AllToAllVExchangingCounts(c, send, sc, so, recv, recv_total,
                                                             &got_counts, &got_offsets));
        } else {
          FLOTILLA_RETURN_IF_ERROR(c.AllToAllV(send, sc, so, recv, rc, ro));
        }
        if (samples_us) {
          samples_us->push_back(
              std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
        }
      }
      return absl::OkStatus();
    };
    std::vector<double> known, exchanged;
    FLOTILLA_RETURN_IF_ERROR(run(cfg.warmup, nullptr, false));
    FLOTILLA_RETURN_IF_ERROR(c.Barrier());
    const auto t0 = Clock::now();
    FLOTILLA_RETURN_IF_ERROR(run(cfg.iters, &known, false));
    const double mean_us =
        std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / cfg.iters;
    FLOTILLA_RETURN_IF_ERROR(c.Barrier());
    FLOTILLA_RETURN_IF_ERROR(run(std::max(cfg.iters / 2, 1), &exchanged, true));
    double pipelined_us = -1;
    if (user_stream != nullptr) {
      // Enqueue back to back on one stream and wait once (how a GPU step runs).
      FLOTILLA_RETURN_IF_ERROR(c.Barrier());
      const auto p0 = Clock::now();
      for (int i = 0; i < cfg.iters; ++i) {
        FLOTILLA_RETURN_IF_ERROR(c.AllToAllV(send, sc, so, recv, rc, ro, user_stream));
      }
      FLOTILLA_RETURN_IF_ERROR(wait_stream(user_stream));
      pipelined_us =
          std::chrono::duration<double, std::micro>(Clock::now() - p0).count() / cfg.iters;
    }
    FLOTILLA_RETURN_IF_ERROR(c.Barrier());
    mem.release(send);
    mem.release(recv);

    if (me == 0) {
      const double p50 = Percentile(known, 0.5);
      const double ms_per_token = kLayers * kAllToAllsPerLayer * p50 / 1000.0;
      nlohmann::json j = {
          {"bench", "comm_all_to_all"},
          {"backend", cfg.backend},
          {"world", cfg.world},
          {"tokens_per_rank", tokens},
          {"hidden", cfg.hidden},
          {"dtype", "bf16"},
          {"topk", cfg.topk},
          {"experts", cfg.experts},
          {"rank0_send_bytes", send_total},
          {"rank0_offrank_bytes", offrank},
          {"us_p50", p50},
          {"us_p99", Percentile(known, 0.99)},
          {"us_mean", mean_us},
          {"us_p50_with_count_exchange", Percentile(exchanged, 0.5)},
          {"rank0_offrank_GBps", offrank / (p50 * 1e3)},
          {"layers", kLayers},
          {"all_to_alls_per_layer", kAllToAllsPerLayer},
          {"ms_per_decode_step_36x2", ms_per_token},
          {"budget_ms_per_token", cfg.budget_ms_per_token},
          {"budget_fraction", ms_per_token / cfg.budget_ms_per_token},
          {"iters", cfg.iters},
      };
      if (pipelined_us >= 0) j["us_mean_stream_pipelined"] = pipelined_us;
      if (!extra_label.empty()) j["transport"] = extra_label;
      std::printf("%s\n", j.dump().c_str());
      std::fflush(stdout);
    }
  }
  return absl::OkStatus();
}

Memory HostMemory() {
  return {[](size_t n) { return static_cast<void*>(new uint8_t[n]()); },
          [](void* p) { delete[] static_cast<uint8_t*>(p); }};
}

int RunLocal(const Config& cfg) {
  auto rv = LocalRendezvous::Create(cfg.world);
  if (!rv.ok()) {
    std::fprintf(stderr, "%s\n", rv.status().ToString().c_str());
    return 1;
  }
  std::vector<absl::Status> results(static_cast<size_t>(cfg.world));
  std::vector<std::thread> threads;
  for (int r = 0; r < cfg.world; ++r) {
    threads.emplace_back([&, r] {
      auto c = LocalCommunicator::Create(*rv, r, {absl::Seconds(cfg.timeout_s)});
      results[static_cast<size_t>(r)] =
          c.ok() ? RunRank(**c, cfg, HostMemory(), nullptr, nullptr, "threads") : c.status();
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& st : results) {
    if (!st.ok()) {
      std::fprintf(stderr, "local: %s\n", st.ToString().c_str());
      return 1;
    }
  }
  return 0;
}

#if FLOTILLA_BENCH_UCX
int RunUcxChild(const Config& cfg) {
  UcxOptions options;
  options.timeout = absl::Seconds(cfg.timeout_s);
  options.detect_peer_failure = cfg.detect_peer_failure;
  auto worker = UcxWorker::Create(options);
  if (!worker.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", cfg.rank, worker.status().ToString().c_str());
    return 1;
  }
  const fs::path dir(cfg.dir);
  const fs::path tmp = dir / ("addr." + std::to_string(cfg.rank) + ".tmp");
  std::ofstream(tmp, std::ios::binary) << (*worker)->Address();
  fs::rename(tmp, dir / ("addr." + std::to_string(cfg.rank)));
  std::vector<std::string> addresses(static_cast<size_t>(cfg.world));
  for (int p = 0; p < cfg.world; ++p) {
    const fs::path f = dir / ("addr." + std::to_string(p));
    const auto give_up = Clock::now() + std::chrono::duration<double>(cfg.timeout_s);
    while (!fs::exists(f)) {
      if (Clock::now() > give_up) {
        std::fprintf(stderr, "rank %d: no address from rank %d\n", cfg.rank, p);
        return 1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    std::stringstream ss;
    ss << std::ifstream(f, std::ios::binary).rdbuf();
    addresses[static_cast<size_t>(p)] = ss.str();
  }
  auto c = UcxCommunicator::Create(std::move(*worker), cfg.rank, addresses, options);
  if (!c.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", cfg.rank, c.status().ToString().c_str());
    return 1;
  }
  std::string lanes;
  if (cfg.world > 1) {
    // First transport line of UCX's description of the connection to a peer.
    std::istringstream info((*c)->TransportInfo(cfg.rank == 0 ? 1 : 0));
    for (std::string line; std::getline(info, line);) {
      if (line.find("lane[") == std::string::npos) continue;
      // "lane[0]:  3:sysv/memory.0 md[2] -> ... am am_bw#0": keep transport and role.
      std::istringstream words(line);
      std::string w, kept;
      while (words >> w) {
        if (w == "#" || w.rfind("md[", 0) == 0 || w == "->") continue;
        if (w.find("sysdev") != std::string::npos) continue;
        kept += (kept.empty() ? "" : " ") + w;
      }
      lanes += (lanes.empty() ? "" : "; ") + kept;
    }
  }
  absl::Status st = RunRank(
      **c, cfg, HostMemory(), nullptr, nullptr,
      std::string(cfg.detect_peer_failure ? "ucx(peer-failure detection): " : "ucx: ") + lanes);
  if (!st.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", cfg.rank, st.ToString().c_str());
    return 1;
  }
  return 0;
}

int RunUcxParent(const Config& cfg, const std::vector<std::string>& args) {
  char tmpl[] = "/tmp/flotilla_comm_bench.XXXXXX";
  const char* dir = mkdtemp(tmpl);
  if (dir == nullptr) {
    std::perror("mkdtemp");
    return 1;
  }
  std::vector<pid_t> pids;
  for (int r = 0; r < cfg.world; ++r) {
    std::vector<std::string> a = args;
    a.insert(a.end(), {"--rank", std::to_string(r), "--dir", dir});
    std::vector<char*> argv;
    for (auto& s : a) argv.push_back(s.data());
    argv.push_back(nullptr);
    pid_t pid;
    if (posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv.data(), environ) != 0) {
      std::perror("posix_spawn");
      for (pid_t p : pids) kill(p, SIGKILL);
      return 1;
    }
    pids.push_back(pid);
  }
  int rc = 0;
  for (pid_t p : pids) {
    int status = 0;
    waitpid(p, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) rc = 1;
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
  return rc;
}
#endif

}  // namespace
}  // namespace flotilla::comm

int main(int argc, char** argv) {
  using flotilla::comm::Config;
  Config cfg;
  CLI::App app{"MoE all-to-all latency and bandwidth at decode sizes (JSON lines)"};
  app.add_option("--backend", cfg.backend, "local or ucx")
      ->check(CLI::IsMember({"local", "ucx"}));
  app.add_option("--world", cfg.world, "ranks (threads or processes)")
      ->check(CLI::Range(1, 64));
  app.add_option("--tokens", cfg.tokens, "tokens per rank, one line each")->delimiter(',');
  app.add_option("--hidden", cfg.hidden, "bf16 values per token")->check(CLI::Range(1, 1 << 20));
  app.add_option("--topk", cfg.topk, "experts per token")->check(CLI::Range(1, 64));
  app.add_option("--experts", cfg.experts, "experts per layer")->check(CLI::Range(1, 4096));
  app.add_option("--iters", cfg.iters, "timed iterations")->check(CLI::Range(1, 1000000));
  app.add_option("--warmup", cfg.warmup, "untimed iterations")->check(CLI::Range(0, 1000000));
  app.add_option("--timeout-s", cfg.timeout_s, "communicator timeout")->check(CLI::PositiveNumber);
  app.add_option("--budget-ms-per-token", cfg.budget_ms_per_token)->check(CLI::PositiveNumber);
  app.add_option("--detect-peer-failure", cfg.detect_peer_failure,
                 "ucx: let UCX report dead peers (TCP only in UCX 1.13)");
  app.add_option("--rank", cfg.rank)->group("");  // internal: UCX child
  app.add_option("--dir", cfg.dir)->group("");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (cfg.topk > cfg.experts) {
    std::fprintf(stderr, "--topk %d exceeds --experts %d\n", cfg.topk, cfg.experts);
    return 2;
  }
  for (int t : cfg.tokens) {
    if (t < 0 || t > 1 << 20) {
      std::fprintf(stderr, "--tokens: %d is out of range\n", t);
      return 2;
    }
  }
  if (cfg.backend == "local") return flotilla::comm::RunLocal(cfg);
#if FLOTILLA_BENCH_UCX
  if (cfg.rank >= 0) return flotilla::comm::RunUcxChild(cfg);
  return flotilla::comm::RunUcxParent(cfg, std::vector<std::string>(argv, argv + argc));
#else
  std::fprintf(stderr, "this build has no UCX backend (FLOTILLA_UCX=OFF)\n");
  return 2;
#endif
}
