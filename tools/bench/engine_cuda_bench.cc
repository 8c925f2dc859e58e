// Whole-model throughput of the CUDA engine at gpt-oss shapes (default
// 120b) with weights filled on the device (no checkpoint). JSON lines:
//   {"bench":"decode_step", batch, context, filled, ms_per_step, tokens_per_s,
//    bytes_per_step, gbs, hbm_gbs, roofline_tokens_per_s, fraction_of_roofline}
//   {"bench":"prefill", prompt_tokens, ms, tokens_per_s, tflops, peak_tflops}
// Decode steps sample on the GPU and return tokens to the host every step, as
// serving does; the bytes a step must read are the bf16 matrices, lm_head,
// the distinct experts the batch is expected to touch and the KV it attends
// over, so `roofline_tokens_per_s` is what HBM bandwidth alone would allow.
// `filled` is the context before the first decode step: `--context`, or less
// where the decode steps would pass the model's limit (then the last step's
// sequences hold exactly `--context` tokens, e.g. 131072).
//   engine_cuda_bench [--layers N] [--batches 1,8,64,256] [--context 1024]
//                     [--prefill 2048,8192] [--steps 64] [--hbm-gbs G]
//                     [--kv-blocks N|auto] (blocks in each KV pool; auto: what the
//                                          device's memory leaves, as serving sizes it)
//                     [--max-sequences N] (sequences the engine is sized for; default
//                                          the largest batch)
//                     [--kv-cache-dtype auto|bf16|fp8] (fp8: the full-attention
//                                          layers' KV in e4m3 with scales)
//                     [--profile-ops 1]   (per-op GPU time per step; graphs off)
//                     [--deterministic 1] (CudaEngineOptions::deterministic)
//                     [--time-device 1]   (events around each step's uploads and
//                                          launched work: {"bench":"decode_step_split"}
//                                          with the device's idle time between steps)
//                     [--fused-qkv-max-tokens 2] (0: norm, QKV and RoPE as three launches)
//                     [--qkv-l2-prefetch 1] [--qkv-early-loads 1] [--qkv-late-dependents 1]
//                     [--qkv-stage-weights 1]
//                                          (NormQkvRopeTuning)
//                     [--moe-gemm-min-pairs 4] (MoeTuning: grouped GEMMs from this many
//                                          pairs per expert; -1: never)
//                     [--moe-gemm-h-low-part-below 0] (MoeTuning: 32-row GEMM tiles
//                                          carry h's f16 low part below this many pairs
//                                          per expert; 0: never)
//                     [--moe-gemm-rows-per-tile 0] (MoeTuning: 32, 64, 128 or 160; 0 picks)
//                     [--moe-gemm-remainder-tiles 1] (0: an expert's last GEMM tile
//                                          at full height, not as half-height tiles)
//                     [--moe-gemm-two-streams 1] (0: the tensor-map GEMMs' big and
//                                          remainder tiles in one stream)
//                     [--moe-down-split-k 1] (MoeTuning: CTAs sharing each 16-row
//                                          tile of the decode kernels' down projection)
//                     [--moe-fuse-max-tokens 8] (MoeTuning: the decode kernels' two
//                                          projections in one launch up to this many
//                                          tokens; 0: always two launches)
//                     [--fused-router-norm-max-tokens 8] (0: the post-attention norm
//                                          as its own launch)
//                     [--route-in-router 1] (0: the MoE routes in a launch of its own
//                                          rather than in the fused router's kernel)
//                     [--router-cluster-max-tokens 8] (the fused router as one
//                                          cluster of CTAs up to this many tokens, above
//                                          as a grid with atomics; 0: never)
//                     [--attention-wgmma 1] (0: prefill attention on mma.sync rather
//                                          than warpgroup MMA)
//                     [--l2-prefetch-max-tokens 4] (0: no L2 prefetch of the O
//                                          projection's weights beside the step)
//                     [--l2-prefetch-next-qkv-max-tokens 2] (steps up to N also ask
//                                          for the next layer's QKV weights while
//                                          the router runs)
//                     [--masked-rows N]   (then the same steps with N rows drawing under a
//                                          structured-output token mask, written by the
//                                          host while the step runs as serving does:
//                                          {"bench":"decode_step_masked"} beside the plain step)
//                     [--verify-tokens 1,2,3] (then steps whose every row carries K
//                                          drafted tokens, verified as serving verifies
//                                          them: {"bench":"verify_step"} with the cost
//                                          against a one-token step through the same
//                                          samplers and the speedup each acceptance
//                                          length would give)
//                     [--ablate op1,op2]  (graph replays with each op left out in
//                                          turn: {"bench":"decode_ablation"} lines
//                                          give each op's share of a real step)
//                     [--shard W]         (one rank's share of a TP group of W with the
//                                          tensor-parallel MoE and group logits, run
//                                          without its exchanges: heads, KV heads,
//                                          the experts' intermediate size (the
//                                          largest slice of its 32-wide blocks) and
//                                          the vocabulary divided by W; the step a
//                                          rank would take if its all-reduces were free)
//                     [--predict-ranks 2,4,8 --allreduce-us 2:12,4:13,8:15
//                      --graph-step-ms 1:3.02,64:26.9]
//                                         (with --profile-ops 1: the step-time model of
//                                          one TP group of W GPUs with the
//                                          tensor-parallel MoE, {"bench":"step_model"};
//                                          the graph step times from a run without
//                                          --profile-ops, else the profiled step's)
//
// The step-time model: the profiled ops split into those W ranks share (QKV
// with its norm and RoPE, attention, the O projection, the MoE: each rank
// reads 1/W of their weights and KV; lm_head too at batches of group logits,
// at most kMaxGroupLogitRows) and those every rank repeats (embedding, norms,
// router, top-k, sampling, lm_head at larger batches); a step on W ranks takes
//   graph_step x (replicated + sharded / W) / (replicated + sharded)
//   + layers x 2 x (the measured all-reduce latency + ~2 us of launch gap)
//   + the logits' all-reduce (group logits: kLogitsExchangeMs),
// the graph step scaling the profiled (ungraphed) sum to what a replayed step
// takes. The all-reduce latency per W comes from flotilla_ep_bench.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/cuda/device.h"
#include "kernels/cuda/moe.h"
#include "kernels/cuda/ops.h"
#include "worker/engine/cuda_engine.h"
#include "worker/engine/sampler.h"

namespace {

using flotilla::CudaEngine;
using flotilla::CudaEngineOptions;
using flotilla::Engine;
using flotilla::LogitsMode;
using flotilla::ModelConfig;
using flotilla::StepItem;
using Clock = std::chrono::steady_clock;

std::vector<long> ParseList(const std::string& s) {
  std::vector<long> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(std::strtol(item.c_str(), nullptr, 10));
  return out;
}

// "K:V,K:V" -> {K: V}.
std::map<long, double> ParsePairs(const std::string& s) {
  std::map<long, double> out;
  std::stringstream ss(s);
  std::string pair;
  while (std::getline(ss, pair, ',')) {
    const size_t colon = pair.find(':');
    if (colon == std::string::npos) continue;
    out[std::strtol(pair.c_str(), nullptr, 10)] = std::strtod(pair.c_str() + colon + 1, nullptr);
  }
  return out;
}

double PeakHbmGbs(int device) {
  int clock_khz = 0, bus_bits = 0;
  if (cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, device) != cudaSuccess) {
    return 0;
  }
  return 2.0 * clock_khz * 1e3 * (bus_bits / 8.0) / 1e9;
}

// The step-time model above, one line per W in `ranks` with a latency.
template <typename OpTimes>
void PrintStepModel(const OpTimes& op_ms, long steps, double graph_step_ms, bool graphed,
                    long layers, long batch, const std::vector<long>& ranks,
                    const std::map<long, double>& allreduce_us) {
  static const std::set<std::string> kSharded = {"qkv_linear", "rope_kv_write", "attention",
                                                 "o_linear", "moe"};
  // Group logits: the split lm_head's rows joined by one all-reduce of rows x
  // vocab floats and a memset and a copy beside it (two H200s, batch 1: the
  // split took 0.11 ms off a step whose lm_head took 0.26 ms, so ~0.02 ms).
  constexpr double kLogitsExchangeMs = 0.02;
  const bool group_logits = batch <= flotilla::kMaxGroupLogitRows;
  double sharded = 0, replicated = 0;
  for (const auto& [label, total] : op_ms) {
    const bool shared = kSharded.count(label) != 0 || (group_logits && label == "lm_head");
    (shared ? sharded : replicated) += total / steps;
  }
  if (sharded + replicated <= 0) return;
  const double scale = graph_step_ms / (sharded + replicated);
  for (long w : ranks) {
    const auto at = allreduce_us.find(w);
    if (w < 1 || at == allreduce_us.end()) continue;
    // Per layer: the O projection's and the MoE's all-reduce, each with a
    // launch gap in the graph (~2 us) beside the op's own latency.
    const double exchange_ms =
        layers * 2 * (at->second + 2.0) / 1e3 + (group_logits && w > 1 ? kLogitsExchangeMs : 0.0);
    const double ms = scale * (replicated + sharded / w) + exchange_ms;
    std::printf(
        "{\"bench\":\"step_model\",\"batch\":%ld,\"ranks\":%ld,\"one_gpu_ms\":%.3f,"
        "\"one_gpu_step\":\"%s\","
        "\"sharded_ms\":%.3f,\"replicated_ms\":%.3f,\"allreduce_us\":%.1f,"
        "\"exchange_ms\":%.3f,\"predicted_ms_per_step\":%.3f,"
        "\"predicted_tokens_per_s\":%.1f,\"speedup\":%.2f}\n",
        batch, w, graph_step_ms, graphed ? "graph replay" : "profiled, no graph", scale * sharded,
        scale * replicated, at->second, exchange_ms, ms, batch * 1e3 / ms, graph_step_ms / ms);
  }
}

// A structured-output filter's cost on the device without a grammar: a
// fixed mask allowing about half the vocabulary (the host still copies it
// into the step's pinned mask slot every step, as it copies a grammar's).
class HalfVocabularyFilter : public flotilla::TokenFilter {
 public:
  explicit HalfVocabularyFilter(int vocab) : bits_((vocab + 31) / 32) {
    for (int t = 0; t < vocab; ++t) {
      if ((static_cast<uint32_t>(t) * 2654435761u) >> 31) bits_[t >> 5] |= 1u << (t & 31);
    }
  }
  const uint32_t* Allowed() override { return bits_.data(); }
  void Accept(int32_t) override {}

 private:
  std::vector<uint32_t> bits_;
};

// Gives each of `items` a sampler of its own (seed = its index, no token
// bound), the first `masked` under HalfVocabularyFilter, drawing instead of
// returning logits, as serving steps do; the samplers go to `*samplers`.
bool AttachSamplers(std::vector<StepItem>& items, long masked, int vocab,
                    std::vector<std::unique_ptr<flotilla::Sampler>>* samplers) {
  for (size_t b = 0; b < items.size(); ++b) {
    flotilla::SamplingParams p;
    p.seed = b;
    p.max_tokens = 1 << 30;
    absl::StatusOr<std::unique_ptr<flotilla::Sampler>> s = flotilla::Sampler::Create(p, vocab);
    if (!s.ok()) return false;
    if (static_cast<long>(b) < masked) {
      (*s)->SetFilter(std::make_unique<HalfVocabularyFilter>(vocab));
    }
    items[b].sampler = s->get();
    items[b].logits = LogitsMode::kNone;
    samplers->push_back(*std::move(s));
  }
  return true;
}

// `steps` decode steps of `items` drawn by per-item samplers (the serving
// path), the first `masked` of them under HalfVocabularyFilter; ms per step,
// or a negative value on an error.
double MaskedStepMs(CudaEngine& e, std::vector<StepItem> items, long masked, long steps,
                    int vocab) {
  std::vector<std::unique_ptr<flotilla::Sampler>> samplers;
  if (!AttachSamplers(items, masked, vocab, &samplers)) return -1;
  auto run = [&](long n) -> bool {
    for (long i = 0; i < n; ++i) {
      absl::StatusOr<flotilla::StepOutput> out = e.Step(items);
      if (!out.ok()) {
        std::fprintf(stderr, "engine_cuda_bench: %s\n", out.status().ToString().c_str());
        return false;
      }
      for (size_t b = 0; b < items.size(); ++b) {
        items[b].tokens = {std::max<int32_t>(out->sampled[b].token, 0)};
      }
    }
    return true;
  };
  if (!run(4)) return -1;  // captures the graph
  const auto t = Clock::now();
  if (!run(steps)) return -1;
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count() / steps;
}

// `steps` decode steps of `items` through per-item samplers (the serving
// path) where every row carries `k` drafted tokens after its last token, so
// the step computes k + 1 positions and verifies the draft as serving does;
// the accepted tokens are committed by the next step. The drafts are
// arbitrary tokens, so nearly all are rejected: the step's work does not
// depend on how many are accepted. ms per step, or a negative value on an
// error.
double DraftedStepMs(CudaEngine& e, std::vector<StepItem> items, int k, long steps, int vocab) {
  std::vector<std::unique_ptr<flotilla::Sampler>> samplers;
  if (!AttachSamplers(items, 0, vocab, &samplers)) return -1;
  std::vector<int32_t> last(items.size());
  for (size_t b = 0; b < items.size(); ++b) last[b] = items[b].tokens.back();
  auto run = [&](long n, long first) -> bool {
    for (long i = 0; i < n; ++i) {
      for (size_t b = 0; b < items.size(); ++b) {
        items[b].tokens = {last[b]};
        for (int j = 0; j < k; ++j) {
          items[b].tokens.push_back(static_cast<int32_t>((7919 * (first + i + j) + b) % vocab));
        }
        items[b].draft_tokens = k;
      }
      absl::StatusOr<flotilla::StepOutput> out = e.Step(items);
      if (!out.ok()) {
        std::fprintf(stderr, "engine_cuda_bench: %s\n", out.status().ToString().c_str());
        return false;
      }
      for (size_t b = 0; b < items.size(); ++b) {
        items[b].accepted_draft.clear();
        if (b < out->accepted.size()) {
          for (const flotilla::TokenLogprob& t : out->accepted[b]) {
            items[b].accepted_draft.push_back(t.token);
          }
        }
        last[b] = std::max<int32_t>(out->sampled[b].token, 0);
      }
    }
    return true;
  };
  if (!run(4, 0)) return -1;
  const auto t = Clock::now();
  if (!run(steps, 4)) return -1;
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count() / steps;
}

}  // namespace

// One rank's share of a TP group of `w` (--shard): what a rank reads and
// computes with the tensor-parallel MoE and group logits, without exchanges.
// Where the experts' 32-wide blocks do not divide by w the largest slice is
// taken (the rank that sets the group's pace).
bool ShardConfig(long w, ModelConfig* c) {
  if (w < 1 || c->num_key_value_heads % w != 0 || c->num_attention_heads % w != 0 ||
      c->intermediate_size % 32 != 0) {
    std::fprintf(stderr, "engine_cuda_bench: --shard %ld must divide the KV heads (%d)\n", w,
                 c->num_key_value_heads);
    return false;
  }
  const int n = static_cast<int>(w);
  c->num_attention_heads /= n;
  c->num_key_value_heads /= n;
  c->intermediate_size = (c->intermediate_size / 32 + n - 1) / n * 32;
  c->vocab_size = (c->vocab_size / n + 15) / 16 * 16;
  // Special tokens inside the smaller vocabulary (the bench never stops on them).
  for (int& id : c->eos_token_ids) id %= c->vocab_size;
  c->pad_token_id %= c->vocab_size;
  return true;
}

int main(int argc, char** argv) {
  long layers = 36, context = 1024, steps = 64, kv_blocks = 0, masked_rows = 0, max_sequences = 0;
  bool profile_ops = false, time_device = false;
  flotilla::KvCacheDtype kv_dtype = flotilla::KvCacheDtype::kBf16;
  long router_norm = CudaEngineOptions().fused_router_norm_max_tokens;
  bool route_in_router = CudaEngineOptions().route_in_router;
  long router_cluster = CudaEngineOptions().router_cluster_max_tokens;
  bool attention_wgmma = CudaEngineOptions().attention_prefill_wgmma;
  bool deterministic = false;
  long fused_qkv = CudaEngineOptions().fused_qkv_max_tokens;
  long l2_prefetch = CudaEngineOptions().l2_prefetch_max_tokens;
  long l2_prefetch_next_qkv = CudaEngineOptions().l2_prefetch_next_qkv_max_tokens;
  flotilla::kernels::cuda::NormQkvRopeTuning qkv_tuning;
  flotilla::kernels::cuda::MoeTuning moe_tuning;
  std::vector<std::string> ablate;
  double hbm_gbs = 0, peak_tflops = 989;
  std::vector<long> batches = {1, 8, 64, 256}, prefills = {2048, 8192};
  std::vector<long> predict_ranks, verify_tokens;
  long shard = 1;
  std::map<long, double> allreduce_us;   // W -> one all-reduce's latency
  std::map<long, double> graph_step_ms;  // batch -> a replayed step's time
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--layers") layers = std::strtol(v.c_str(), nullptr, 10);
    else if (a == "--batches") batches = ParseList(v);
    else if (a == "--context") context = std::strtol(v.c_str(), nullptr, 10);
    else if (a == "--prefill") prefills = v == "none" ? std::vector<long>{} : ParseList(v);
    else if (a == "--steps") steps = std::strtol(v.c_str(), nullptr, 10);
    else if (a == "--hbm-gbs") hbm_gbs = std::strtod(v.c_str(), nullptr);
    else if (a == "--kv-blocks")
      kv_blocks = v == "auto" ? -1 : std::strtol(v.c_str(), nullptr, 10);
    else if (a == "--max-sequences")
      max_sequences = std::strtol(v.c_str(), nullptr, 10);
    else if (a == "--masked-rows")
      masked_rows = std::strtol(v.c_str(), nullptr, 10);
    else if (a == "--verify-tokens")
      verify_tokens = ParseList(v);
    else if (a == "--profile-ops") profile_ops = v == "1" || v == "true";
    else if (a == "--time-device")
      time_device = v == "1" || v == "true";
    else if (a == "--kv-cache-dtype") {
      const absl::StatusOr<flotilla::KvCacheDtype> d = flotilla::ParseKvCacheDtype(v);
      if (!d.ok()) {
        std::fprintf(stderr, "engine_cuda_bench: %s\n", std::string(d.status().message()).c_str());
        return 2;
      }
      kv_dtype = *d;
    } else if (a == "--shard")
      shard = std::strtol(v.c_str(), nullptr, 10);
    else if (a == "--predict-ranks")
      predict_ranks = ParseList(v);
    else if (a == "--allreduce-us")
      allreduce_us = ParsePairs(v);
    else if (a == "--graph-step-ms")
      graph_step_ms = ParsePairs(v);
    else if (a == "--ablate") {
      std::stringstream ss(v);
      std::string op;
      while (std::getline(ss, op, ',')) ablate.push_back(op);
    } else if (a == "--deterministic") {
      deterministic = v == "1" || v == "true";
    } else if (a == "--fused-router-norm-max-tokens") {
      router_norm = std::strtol(v.c_str(), nullptr, 10);
    } else if (a == "--route-in-router") {
      route_in_router = v == "1" || v == "true";
    } else if (a == "--router-cluster-max-tokens") {
      router_cluster = std::strtol(v.c_str(), nullptr, 10);
    } else if (a == "--attention-wgmma") {
      attention_wgmma = v == "1" || v == "true";
    } else if (a == "--l2-prefetch-max-tokens") {
      l2_prefetch = std::strtol(v.c_str(), nullptr, 10);
    } else if (a == "--l2-prefetch-next-qkv-max-tokens") {
      l2_prefetch_next_qkv = std::strtol(v.c_str(), nullptr, 10);
    } else if (a == "--fused-qkv-max-tokens")
      fused_qkv = std::strtol(v.c_str(), nullptr, 10);
    else if (a == "--qkv-l2-prefetch") qkv_tuning.l2_prefetch = v == "1" || v == "true";
    else if (a == "--qkv-early-loads") qkv_tuning.early_loads = v == "1" || v == "true";
    else if (a == "--qkv-late-dependents") qkv_tuning.late_dependents = v == "1" || v == "true";
    else if (a == "--qkv-stage-weights")
      qkv_tuning.stage_weights = v == "1" || v == "true";
    else if (a == "--moe-gemm-min-pairs") {
      moe_tuning.gemm_min_pairs_per_expert = static_cast<int>(std::strtol(v.c_str(), nullptr, 10));
    } else if (a == "--moe-gemm-h-low-part-below") {
      moe_tuning.gemm_h_low_part_below_pairs =
          static_cast<int>(std::strtol(v.c_str(), nullptr, 10));
    } else if (a == "--moe-gemm-rows-per-tile") {
      moe_tuning.gemm_rows_per_tile = static_cast<int>(std::strtol(v.c_str(), nullptr, 10));
    } else if (a == "--moe-fuse-max-tokens") {
      moe_tuning.fuse_projections_max_tokens =
          static_cast<int>(std::strtol(v.c_str(), nullptr, 10));
    } else if (a == "--moe-gemm-remainder-tiles") {
      moe_tuning.gemm_remainder_tiles = v == "1" || v == "true";
    } else if (a == "--moe-gemm-two-streams") {
      moe_tuning.gemm_two_streams = v == "1" || v == "true";
    } else if (a == "--moe-down-split-k") {
      moe_tuning.down_split_k = static_cast<int>(std::strtol(v.c_str(), nullptr, 10));
    } else {
      std::fprintf(stderr, "engine_cuda_bench: unknown option %s\n", a.c_str());
      return 2;
    }
  }
  if (flotilla::kernels::cuda::DeviceCount() == 0) {
    std::printf("{\"bench\":\"engine_cuda\",\"skipped\":\"no CUDA device\"}\n");
    return 0;
  }
  flotilla::kernels::cuda::DeviceProps props;
  flotilla::kernels::cuda::GetDeviceProps(0, &props);
  if (hbm_gbs <= 0) hbm_gbs = PeakHbmGbs(0);

  ModelConfig c = ModelConfig::Gptoss120b();
  if (!ShardConfig(shard, &c)) return 2;
  c.num_hidden_layers = static_cast<int>(layers);
  c.layer_types.resize(layers);
  for (long l = 0; l < layers; ++l) {
    c.layer_types[l] = l % 2 == 0 ? flotilla::LayerType::kSlidingAttention
                                  : flotilla::LayerType::kFullAttention;
  }
  long max_batch = 1;
  for (long b : batches) max_batch = std::max(max_batch, b);
  long max_prefill = 0;
  for (long p : prefills) max_prefill = std::max(max_prefill, p);
  CudaEngineOptions o;
  o.max_sequences = static_cast<int>(std::max({max_batch, max_sequences, 1L}));
  long max_verify = 0;  // the most drafted tokens of a --verify-tokens step
  for (long k : verify_tokens) max_verify = std::max(max_verify, k);
  o.max_batch_tokens =
      static_cast<int>(std::max({max_prefill, max_batch * (max_verify + 1), 256L}));
  // Every decode step of a batch (the 4 that capture, the timed ones and,
  // per ablated op, 2 more captures and the timed ones again) grows its
  // sequences by a token.
  const long decode_steps =
      4 + steps + static_cast<long>(ablate.size()) * (2 + steps) +
      (masked_rows > 0 ? 2 * (4 + steps) : 0) +
      (verify_tokens.empty()
           ? 0
           : (1 + static_cast<long>(verify_tokens.size())) * (4 + steps) + max_verify);
  // A context at the model's limit (131,072 for gpt-oss) cannot take the
  // decode steps on top of it: the sequences are filled short by those steps,
  // so the last one holds exactly `context` tokens.
  const long limit = c.max_position_embeddings;
  if (context < 1 || context > limit) {
    std::fprintf(stderr, "engine_cuda_bench: --context %ld is outside [1, %ld]\n", context, limit);
    return 2;
  }
  const long filled = std::min(context, limit - decode_steps);
  if (filled < 1) {
    std::fprintf(stderr, "engine_cuda_bench: %ld decode steps leave no room in a context of %ld\n",
                 decode_steps, context);
    return 2;
  }
  o.max_context = std::min(std::max(filled + decode_steps + 16, max_prefill + 16), limit);
  // Blocks of 16 positions in each pool (one per layer group): a table of
  // every sequence (the full-attention pool's need; the sliding-window pool
  // needs less) and one step's chunk. --kv-blocks auto: what the device's
  // memory leaves (as serving sizes it).
  o.kv_num_blocks = kv_blocks < 0   ? 0
                    : kv_blocks > 0 ? kv_blocks
                                    : std::max(max_batch * ((filled + decode_steps + 16) / 16 + 1),
                                               max_prefill / 16 + 2) +
                                          o.max_batch_tokens / 16 + 1;
  o.profile_ops = profile_ops;
  o.time_device_steps = time_device;
  o.kv_cache_dtype = kv_dtype;
  o.fused_qkv_max_tokens = static_cast<int>(fused_qkv);
  o.fused_router_norm_max_tokens = static_cast<int>(router_norm);
  o.route_in_router = route_in_router;
  o.router_cluster_max_tokens = static_cast<int>(router_cluster);
  o.attention_prefill_wgmma = attention_wgmma;
  o.deterministic = deterministic;
  o.l2_prefetch_max_tokens = static_cast<int>(l2_prefetch);
  o.l2_prefetch_next_qkv_max_tokens = static_cast<int>(l2_prefetch_next_qkv);
  o.qkv_tuning = qkv_tuning;
  o.moe_tuning = moe_tuning;
  const auto t0 = Clock::now();
  auto made = CudaEngine::CreateSynthetic(c, 42, o);
  if (!made.ok()) {
    std::fprintf(stderr, "engine_cuda_bench: %s\n", made.status().ToString().c_str());
    return 1;
  }
  CudaEngine& e = **made;
  const double build_s = std::chrono::duration<double>(Clock::now() - t0).count();
  std::string pools;  // each KV pool (one per layer group): its blocks and their size
  for (int p = 0; p < e.kv_pools().num_pools(); ++p) {
    pools += (p > 0 ? ",{" : "{") + std::string("\"pool\":\"") + e.kv_pools().pool_name(p) +
             "\",\"blocks\":" + std::to_string(e.kv_pools().pool_blocks(p)) +
             ",\"block_bytes\":" + std::to_string(e.kv_pool_block_bytes(p)) + "}";
  }
  std::printf(
      "{\"bench\":\"engine_cuda_setup\",\"gpu\":\"%s\",\"layers\":%ld,\"weight_gb\":%.2f,"
      "\"kv_blocks\":%lld,\"kv_pools\":[%s],\"kv_cache_dtype\":\"%s\",\"deterministic\":%s,"
      "\"build_s\":%.1f,\"hbm_gbs\":%.0f}\n",
      props.name.c_str(), layers, e.weight_bytes() / 1e9, static_cast<long long>(e.num_kv_blocks()),
      pools.c_str(), flotilla::KvCacheDtypeName(kv_dtype), deterministic ? "true" : "false",
      build_s, hbm_gbs);
  std::fflush(stdout);

  // Per-token and per-layer byte counts for the roofline.
  const double H = c.hidden_size, D = c.head_dim, NH = c.num_attention_heads,
               NKV = c.num_key_value_heads, E = c.num_local_experts, K = c.num_experts_per_tok;
  const double dense_layer = ((NH + 2 * NKV) * D * H + H * NH * D + E * H) * 2;
  const double expert_bytes =
      (2 * c.intermediate_size * H + H * c.intermediate_size) * 17.0 / 32.0 +
      (2 * c.intermediate_size + H) * 2;
  const double lm_head = static_cast<double>(c.vocab_size) * H * 2;
  const double kv_token_layer = 2 * NKV * D * 2;
  // Full-attention layers with fp8: a byte per value and a bf16 scale per head.
  const double kv_token_full_layer =
      kv_dtype == flotilla::KvCacheDtype::kFp8 ? 2 * NKV * (D + 2) : kv_token_layer;

  for (long B : batches) {
    std::vector<StepItem> items;
    std::vector<int64_t> seqs;
    bool ok = true;
    for (long b = 0; b < B && ok; ++b) {
      const int64_t s = e.NewSequence();
      seqs.push_back(s);
      ok = e.ExtendSynthetic(s, filled).ok();
      items.push_back(StepItem{s, {static_cast<int32_t>(1000 + b)}, LogitsMode::kLast});
    }
    if (!ok) {
      std::printf("{\"bench\":\"decode_step\",\"batch\":%ld,\"error\":\"KV cache too small\"}\n", B);
      for (int64_t s : seqs) (void)e.FreeSequence(s);
      continue;
    }
    std::vector<flotilla::kernels::cuda::SamplingRow> rows(B);
    for (long b = 0; b < B; ++b) rows[b].seed = static_cast<uint64_t>(b);
    Engine::StepTiming split;  // summed over the timed steps (--time-device)
    auto step = [&](int n) -> bool {
      split = {};
      for (int i = 0; i < n; ++i) {
        for (long b = 0; b < B; ++b) rows[b].step = static_cast<uint64_t>(i);
        auto out = e.StepAndSample(items, rows);
        if (!out.ok()) {
          std::fprintf(stderr, "engine_cuda_bench: %s\n", out.status().ToString().c_str());
          return false;
        }
        const Engine::StepTiming t = e.LastStepTiming();
        split.launch_us += t.launch_us;
        split.wait_us += t.wait_us;
        split.device_idle_us += t.device_idle_us;
        split.device_upload_us += t.device_upload_us;
        split.device_us += t.device_us;
        for (long b = 0; b < B; ++b) items[b].tokens = {std::max<int32_t>((*out)[b].token, 0)};
      }
      return true;
    };
    if (!step(4)) return 1;  // captures the graph
    e.reset_op_times();
    const auto t = Clock::now();
    if (!step(static_cast<int>(steps))) return 1;
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t).count() / steps;
    const double touched = E * (1 - std::pow(1 - K / E, static_cast<double>(B)));
    const double ctx = filled + 4 + steps / 2.0;
    const double kv = B * (kv_token_layer * std::ceil(layers / 2.0) * std::min(ctx, 128.0) +
                           kv_token_full_layer * std::floor(layers / 2.0) * ctx);
    const double bytes = layers * (dense_layer + touched * expert_bytes) + lm_head + kv;
    const double gbs = bytes / (ms * 1e-3) / 1e9;
    const double roof_step_ms = bytes / (hbm_gbs * 1e9) * 1e3;
    std::printf(
        "{\"bench\":\"decode_step\",\"gpu\":\"%s\",\"shard\":%ld,\"layers\":%ld,"
        "\"batch\":%ld,\"context\":%ld,\"filled\":%ld,\"ms_per_step\":%.3f,\"tokens_per_s\":%.1f,"
        "\"bytes_per_step_gb\":%.3f,\"gbs\":%.0f,\"hbm_gbs\":%.0f,"
        "\"roofline_tokens_per_s\":%.1f,\"fraction_of_roofline\":%.3f}\n",
        props.name.c_str(), shard, layers, B, context, filled, ms, B * 1e3 / ms, bytes / 1e9, gbs,
        hbm_gbs, B * 1e3 / roof_step_ms, roof_step_ms / ms);
    if (time_device) {
      // The step as the device saw it: idle (waiting for the host), the
      // host's layout and uploads, the launched work; the host's own split.
      std::printf(
          "{\"bench\":\"decode_step_split\",\"gpu\":\"%s\",\"batch\":%ld,\"ms_per_step\":%.3f,"
          "\"device_ms\":%.3f,\"device_idle_ms\":%.3f,\"device_upload_ms\":%.3f,"
          "\"host_launch_ms\":%.3f,\"host_wait_ms\":%.3f}\n",
          props.name.c_str(), B, ms, split.device_us / steps / 1e3,
          split.device_idle_us / steps / 1e3, split.device_upload_us / steps / 1e3,
          split.launch_us / steps / 1e3, split.wait_us / steps / 1e3);
    }
    if (masked_rows > 0) {
      // Both through per-request samplers (the serving path), with and
      // without masks, so the difference is the masks' alone.
      const long n = std::min(masked_rows, B);
      const double unmasked_ms = MaskedStepMs(e, items, 0, steps, c.vocab_size);
      const double masked_ms = MaskedStepMs(e, items, n, steps, c.vocab_size);
      if (masked_ms < 0 || unmasked_ms < 0) return 1;
      std::printf(
          "{\"bench\":\"decode_step_masked\",\"gpu\":\"%s\",\"batch\":%ld,"
          "\"masked_rows\":%ld,\"ms_per_step\":%.3f,\"unmasked_ms_per_step\":%.3f,"
          "\"mask_cost_ms\":%.3f,\"ratio\":%.3f}\n",
          props.name.c_str(), B, n, masked_ms, unmasked_ms, masked_ms - unmasked_ms,
          unmasked_ms / masked_ms);
      std::fflush(stdout);
    }
    if (!verify_tokens.empty()) {
      // The one-token step through the same samplers, then each draft length.
      const double one_ms = MaskedStepMs(e, items, 0, steps, c.vocab_size);
      if (one_ms < 0) return 1;
      for (long k : verify_tokens) {
        if (k < 1) continue;
        const double k_ms = DraftedStepMs(e, items, static_cast<int>(k), steps, c.vocab_size);
        if (k_ms < 0) return 1;
        // Acceptance length L (tokens a verification step gives, at most
        // k + 1) turns k_ms into L tokens: speedup L x one_ms / k_ms.
        std::string speedups;
        for (double L : {1.5, 2.0, 2.5, 3.0, 3.5}) {
          if (L > k + 1) break;
          char buf[64];
          std::snprintf(buf, sizeof(buf), "%s\"%.1f\":%.3f", speedups.empty() ? "" : ",", L,
                        L * one_ms / k_ms);
          speedups += buf;
        }
        std::printf(
            "{\"bench\":\"verify_step\",\"gpu\":\"%s\",\"batch\":%ld,\"draft_tokens\":%ld,"
            "\"ms_per_step\":%.3f,\"one_token_ms_per_step\":%.3f,\"cost_vs_one_token\":%.3f,"
            "\"speedup_at_acceptance_length\":{%s}}\n",
            props.name.c_str(), B, k, k_ms, one_ms, k_ms / one_ms, speedups.c_str());
        std::fflush(stdout);
      }
    }
    // Ablation: the same steps with one op left out; the difference is what
    // that op costs inside the replayed graph (overlap with its neighbours
    // included). The sequences grow by the steps run, which is negligible.
    for (const std::string& op : ablate) {
      e.SetSkipOps({op});
      if (!step(2)) return 1;
      const auto ta = Clock::now();
      if (!step(static_cast<int>(steps))) return 1;
      const double ms_without =
          std::chrono::duration<double, std::milli>(Clock::now() - ta).count() / steps;
      std::printf("{\"bench\":\"decode_ablation\",\"batch\":%ld,\"op\":\"%s\","
                  "\"ms_per_step\":%.3f,\"ms_without\":%.3f,\"op_ms_per_step\":%.3f}\n",
                  B, op.c_str(), ms, ms_without, ms - ms_without);
      std::fflush(stdout);
    }
    if (!ablate.empty()) e.SetSkipOps({});
    if (profile_ops) {
      // Per-op GPU time (events between launches, no graphs): where a step goes.
      std::printf("{\"bench\":\"decode_ops\",\"batch\":%ld,\"ms_per_step\":{", B);
      bool first = true;
      for (const auto& [label, total] : e.op_time_ms()) {
        std::printf("%s\"%s\":%.4f", first ? "" : ",", label.c_str(), total / steps);
        first = false;
      }
      std::printf("}}\n");
      const auto graphed = graph_step_ms.find(B);
      PrintStepModel(e.op_time_ms(), steps, graphed != graph_step_ms.end() ? graphed->second : ms,
                     graphed != graph_step_ms.end(), layers, B, predict_ranks, allreduce_us);
    }
    std::fflush(stdout);
    for (int64_t s : seqs) (void)e.FreeSequence(s);
  }

  for (long P : prefills) {
    const int64_t s = e.NewSequence();
    std::vector<int32_t> prompt(P);
    for (long i = 0; i < P; ++i) prompt[i] = static_cast<int32_t>((i * 7919) % 200000);
    // One warm-up pass at this size, then the measured one.
    for (int pass = 0; pass < 2; ++pass) {
      const int64_t seq = pass == 0 ? e.NewSequence() : s;
      e.reset_op_times();
      const auto t = Clock::now();
      auto out = e.Step({StepItem{seq, prompt, LogitsMode::kLast}});
      if (!out.ok()) {
        std::printf("{\"bench\":\"prefill\",\"prompt_tokens\":%ld,\"error\":\"%s\"}\n", P,
                    std::string(out.status().message()).c_str());
        break;
      }
      const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t).count();
      if (pass == 0) {
        (void)e.FreeSequence(seq);
        continue;
      }
      // FLOPs: 2 per weight per token (experts: K of them), attention QK and PV.
      const double dense_params = layers * (dense_layer / 2) + lm_head / 2 / P;
      const double expert_params = layers * K * 3 * c.intermediate_size * H;
      double attn_pairs = 0;
      for (long l = 0; l < layers; ++l) {
        const double w = l % 2 == 0 ? std::min<double>(c.sliding_window, P) : P / 2.0;
        attn_pairs += P * w;
      }
      const double flops = 2 * P * (dense_params + expert_params) + 4 * attn_pairs * NH * D;
      std::printf("{\"bench\":\"prefill\",\"gpu\":\"%s\",\"layers\":%ld,\"prompt_tokens\":%ld,"
                  "\"ms\":%.1f,\"tokens_per_s\":%.0f,\"tflops\":%.1f,\"peak_bf16_tflops\":%.0f}\n",
                  props.name.c_str(), layers, P, ms, P * 1e3 / ms, flops / (ms * 1e-3) / 1e12,
                  peak_tflops);
      if (profile_ops) {
        std::printf("{\"bench\":\"prefill_ops\",\"prompt_tokens\":%ld,\"ms\":{", P);
        bool first = true;
        for (const auto& [label, total] : e.op_time_ms()) {
          std::printf("%s\"%s\":%.3f", first ? "" : ",", label.c_str(), total);
          first = false;
        }
        std::printf("}}\n");
      }
      std::fflush(stdout);
    }
    (void)e.FreeSequence(s);
  }
  return 0;
}
