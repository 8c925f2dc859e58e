// CPU engine benchmark: prefill and decode tokens/s for synthetic models built
// in memory (deterministic weights, nothing read from disk), each printed as a
// JSON line beside this machine's memory-bandwidth bound. The bandwidth is
// measured here with a multi-threaded streaming read.
//
//   flotilla-cpu-bench [--models tiny,20b-2l] [--threads N] [--prefill 128]
//                      [--decode 16] [--batch 1]
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/model_config.h"
#include "kernels/cpu/thread_pool.h"
#include "worker/engine/cpu_engine.h"
#include "worker/model/synthetic_weights.h"

namespace flotilla {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Best of several passes of a parallel streaming read over `bytes`.
double MeasureReadBandwidth(kernels::cpu::ThreadPool& pool, int64_t bytes) {
  const int64_t n = bytes / sizeof(uint64_t);
  std::vector<uint64_t> buf(n);
  pool.ParallelFor(n, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) buf[i] = static_cast<uint64_t>(i) * 2654435761u;
  });
  double best = 0;
  std::vector<uint64_t> sinks(pool.num_threads() * 8, 0);
  for (int pass = 0; pass < 5; ++pass) {
    auto t0 = Clock::now();
    pool.ParallelFor(n, [&](int64_t b, int64_t e) {
      uint64_t acc[8] = {};
      for (int64_t i = b; i + 8 <= e; i += 8) {
        for (int k = 0; k < 8; ++k) acc[k] ^= buf[i + k];
      }
      uint64_t s = 0;
      for (uint64_t a : acc) s ^= a;
      sinks[(b / std::max<int64_t>(1, (n + pool.num_threads() - 1) / pool.num_threads())) * 8] ^= s;
    });
    best = std::max(best, static_cast<double>(bytes) / Seconds(t0, Clock::now()));
  }
  uint64_t all = 0;
  for (uint64_t s : sinks) all ^= s;
  if (all == 1) std::cerr << "";  // keeps the reads observable
  return best;
}

// Bytes one decode token reads at batch 1: embedding row, per layer the norms,
// attention, router and K experts, the KV cache it attends to, then lm_head.
double DecodeBytesPerToken(const ModelConfig& c, int64_t context) {
  const double H = c.hidden_size, I = c.intermediate_size, D = c.head_dim;
  const double NH = c.num_attention_heads, NKV = c.num_key_value_heads, E = c.num_local_experts;
  const double K = c.num_experts_per_tok, V = c.vocab_size;
  double bytes = H * 2;  // embedding row
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    bytes += 2 * H * 2;                                           // norms
    bytes += (NH * D * H + 2 * NKV * D * H + H * NH * D) * 2;    // q, k, v, o
    bytes += (NH * D + 2 * NKV * D + H) * 2 + NH * 4;            // biases, sinks
    bytes += (E * H + E) * 2;                                    // router
    bytes += K * ((2 * I * H + H * I) * 17.0 / 32 + (2 * I + H) * 2);  // experts (MXFP4)
    const double keys = c.is_sliding(l) ? std::min<double>(context, c.sliding_window) : context;
    bytes += keys * NKV * D * 4 * 2;  // f32 K and V
  }
  bytes += H * 2 + V * H * 2;  // final norm, lm_head
  return bytes;
}

// Bytes a prefill step reads at least: every weight once (all experts, as a
// long prompt touches them all).
double PrefillBytes(const ModelConfig& c) {
  ModelConfig all = c;
  all.num_experts_per_tok = c.num_local_experts;
  return DecodeBytesPerToken(all, 0);
}

struct ModelCase {
  std::string name;
  ModelConfig config;
};

absl::Status RunCase(const ModelCase& mc, kernels::cpu::ThreadPool& pool, double bandwidth,
                     int64_t prefill, int64_t decode, int64_t batch) {
  const ModelConfig& c = mc.config;
  auto t0 = Clock::now();
  absl::StatusOr<ModelWeights> w = MakeSyntheticWeights(c, /*seed=*/1);
  if (!w.ok()) return w.status();
  const double build_s = Seconds(t0, Clock::now());
  CpuEngineOptions o;
  o.kv_num_blocks =
      CpuEngine::KvBlocksFor(c, c.num_key_value_heads, o.kv_block_size, batch, prefill + decode);
  absl::StatusOr<std::unique_ptr<CpuEngine>> e = CpuEngine::Create(std::move(*w), o, &pool);
  if (!e.ok()) return e.status();
  CpuEngine& engine = **e;

  std::vector<StepItem> items;
  for (int64_t b = 0; b < batch; ++b) {
    StepItem it;
    it.sequence = engine.NewSequence();
    for (int64_t i = 0; i < prefill; ++i) {
      it.tokens.push_back(static_cast<int32_t>((i * 7919 + b * 131 + 1) % c.vocab_size));
    }
    items.push_back(std::move(it));
  }
  t0 = Clock::now();
  absl::StatusOr<StepOutput> out = engine.Step(items);
  if (!out.ok()) return out.status();
  const double prefill_s = Seconds(t0, Clock::now());
  const double prefill_tokens = static_cast<double>(prefill * batch);

  nlohmann::json p = {{"bench", "cpu_engine"},        {"phase", "prefill"},
                      {"model", mc.name},             {"layers", c.num_hidden_layers},
                      {"threads", pool.num_threads()}, {"batch", batch},
                      {"tokens", prefill_tokens},      {"seconds", prefill_s},
                      {"tokens_per_s", prefill_tokens / prefill_s},
                      {"weights_build_s", build_s},    {"mem_bw_gb_s", bandwidth / 1e9},
                      {"bytes_read_min", PrefillBytes(c)},
                      {"mem_bound_tokens_per_s", prefill_tokens * bandwidth / PrefillBytes(c)}};
  std::cout << p.dump() << std::endl;

  for (auto& it : items) it.tokens = {1};
  t0 = Clock::now();
  for (int64_t s = 0; s < decode; ++s) {
    out = engine.Step(items);
    if (!out.ok()) return out.status();
    for (size_t i = 0; i < items.size(); ++i) {
      const std::vector<float>& l = out->logits[i];
      items[i].tokens = {static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin())};
    }
  }
  const double decode_s = Seconds(t0, Clock::now());
  const double decode_tokens = static_cast<double>(decode * batch);
  const double bytes = DecodeBytesPerToken(c, prefill + decode / 2);
  nlohmann::json d = {{"bench", "cpu_engine"},        {"phase", "decode"},
                      {"model", mc.name},             {"layers", c.num_hidden_layers},
                      {"threads", pool.num_threads()}, {"batch", batch},
                      {"context", prefill},           {"tokens", decode_tokens},
                      {"seconds", decode_s},          {"tokens_per_s", decode_tokens / decode_s},
                      {"mem_bw_gb_s", bandwidth / 1e9},
                      {"bytes_per_token_batch1", bytes},
                      {"mem_bound_tokens_per_s_batch1", bandwidth / bytes},
                      {"fraction_of_bound_per_sequence", (decode / decode_s) / (bandwidth / bytes)}};
  std::cout << d.dump() << std::endl;
  return absl::OkStatus();
}

}  // namespace
}  // namespace flotilla

int main(int argc, char** argv) {
  CLI::App app{"CPU engine benchmark (JSON lines)"};
  std::vector<std::string> models = {"tiny", "20b-2l"};
  int threads = 0;
  int64_t prefill = 128, decode = 16, batch = 1;
  int64_t bw_mb = 512;
  app.add_option("--models", models, "tiny, 20b-2l (20b shape cut to 2 layers)")
      ->delimiter(',')
      ->check(CLI::IsMember({"tiny", "20b-2l"}));
  app.add_option("--threads", threads, "CPU threads (default: all cores)")->check(CLI::Range(0, 1024));
  app.add_option("--prefill", prefill, "Prompt tokens per sequence")->check(CLI::Range(1, 100000));
  app.add_option("--decode", decode, "Decode steps")->check(CLI::Range(1, 100000));
  app.add_option("--batch", batch, "Sequences per step")->check(CLI::Range(1, 1024));
  app.add_option("--bandwidth-mb", bw_mb, "Buffer for the bandwidth probe (MB)")->check(CLI::Range(16, 65536));
  CLI11_PARSE(app, argc, argv);

  flotilla::kernels::cpu::ThreadPool pool(threads);
  const double bandwidth = flotilla::MeasureReadBandwidth(pool, bw_mb << 20);
  std::cout << nlohmann::json({{"bench", "mem_bw"}, {"threads", pool.num_threads()},
                               {"read_gb_s", bandwidth / 1e9}, {"buffer_mb", bw_mb}})
                   .dump()
            << std::endl;
  for (const std::string& m : models) {
    flotilla::ModelCase mc{m, m == "tiny" ? flotilla::ModelConfig::Tiny()
                                          : flotilla::ModelConfig::Gptoss20b()};
    if (m == "20b-2l") {
      mc.config.num_hidden_layers = 2;
      mc.config.layer_types.resize(2);
    }
    absl::Status st = flotilla::RunCase(mc, pool, bandwidth, prefill, decode, batch);
    if (!st.ok()) {
      std::cerr << "flotilla-cpu-bench: " << m << ": " << st.message() << "\n";
      return 1;
    }
  }
  return 0;
}
