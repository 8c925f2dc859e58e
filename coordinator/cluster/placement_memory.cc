#include "coordinator/cluster/placement_memory.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace flotilla::coordinator {
namespace {

std::string GiB(uint64_t bytes) {
  return absl::StrFormat("%.1f GiB", static_cast<double>(bytes) / (uint64_t{1} << 30));
}

// The ranks that share one physical GPU, and what that GPU offers them.
struct GpuUse {
  std::vector<int> ranks;
  const WorkerDesc* gpu = nullptr;  // the first worker on it: name, size
  uint64_t total_bytes = 0;
  uint64_t free_bytes = 0;  // the least any of its workers saw; 0 = unknown
  double utilization = 0.0;  // the sum of its ranks' shares, at most 1
  double shares = 0.0;       // the same, uncapped
};

double RankShare(const WorkerDesc& w) {
  return w.memory_utilization > 0 ? w.memory_utilization : kDefaultGpuMemoryUtilization;
}

std::map<std::string, GpuUse> GroupByGpu(const std::vector<const WorkerDesc*>& rank_workers) {
  std::map<std::string, GpuUse> gpus;
  for (size_t r = 0; r < rank_workers.size(); ++r) {
    const WorkerDesc& w = *rank_workers[r];
    GpuUse& use = gpus[GpuKey(w)];
    if (use.gpu == nullptr) use.gpu = &w;
    use.ranks.push_back(static_cast<int>(r));
    use.total_bytes = std::max(use.total_bytes, w.memory_bytes);
    if (w.free_memory_bytes > 0) {
      use.free_bytes =
          use.free_bytes == 0 ? w.free_memory_bytes : std::min(use.free_bytes, w.free_memory_bytes);
    }
    // Each engine takes its own share (--gpu-memory-utilization) of the GPU;
    // ranks sharing a GPU together take the sum of their shares.
    use.shares += RankShare(w);
    use.utilization = std::min(1.0, use.shares);
  }
  return gpus;
}

std::string DescribeNeed(const GpuRankNeed& need) {
  return absl::StrCat(GiB(need.weights), " of weights (", need.shard, "), ", GiB(need.kv_minimum),
                      " of KV for ", kMinKvTokens, " tokens and ", GiB(need.runtime),
                      " for the CUDA runtime");
}

// "rank 0 (worker 'w0') needs <amount> on GPU 0 of node 'a' (...): <what>" or,
// for a shared GPU, "ranks 0, 1 (workers ...) share GPU ... and need <amount>
// together (rank 0 alone: <what>)".
std::string WhoNeeds(const GpuUse& use, const std::vector<const WorkerDesc*>& rank_workers,
                     const std::vector<GpuRankNeed>& needs, const std::string& amount) {
  std::vector<std::string> workers;
  for (int r : use.ranks) workers.push_back(absl::StrCat("'", rank_workers[r]->worker_id, "'"));
  const int first = use.ranks.front();
  if (use.ranks.size() == 1) {
    return absl::StrCat("rank ", first, " (worker ", workers[0], ") needs ", amount, " on ",
                        DescribeGpu(*use.gpu), ": ", DescribeNeed(needs[first]));
  }
  return absl::StrCat("ranks ", absl::StrJoin(use.ranks, ", "), " (workers ",
                      absl::StrJoin(workers, ", "), ") share ", DescribeGpu(*use.gpu), " and need ",
                      amount, " together (rank ", first, " alone: ", DescribeNeed(needs[first]),
                      ")");
}

// What would make the ranks fit; a shared GPU gets fuller with every worker
// (each repeats the replicated weights and the runtime).
std::string Advice(const GpuUse& use, bool others_hold_memory) {
  std::string advice = use.ranks.size() > 1
                           ? "put fewer workers on this GPU (spread them over more GPUs)"
                           : "add GPU workers (each rank then holds fewer experts)";
  if (others_hold_memory) return absl::StrCat("free the GPU, or ", advice);
  return absl::StrCat(advice, ", raise --gpu-memory-utilization, or use a larger GPU");
}

}  // namespace

uint64_t EstimateRankBytes(const ModelConfig& m, int tp_size, int experts_on_rank) {
  const uint64_t H = m.hidden_size, I = m.intermediate_size, D = m.head_dim;
  const uint64_t q = m.num_attention_heads * D / tp_size, kv = m.num_key_value_heads * D / tp_size;
  // bf16 attention: q, k, v (with bias), o column slice, sinks.
  const uint64_t attn = 2 * ((q + 2 * kv) * (H + 1) + H * q + H) + 4 * q;
  // MXFP4 expert: 17 bytes per 32 weights, bf16 biases.
  const uint64_t expert = (2 * I * H + H * I) / 32 * 17 + 2 * (2 * I + H);
  const uint64_t router = 2 * (m.num_local_experts * (H + 1));
  const uint64_t norms = 2 * 2 * H;
  const uint64_t per_layer = attn + router + norms;
  const uint64_t embed = 2 * uint64_t(m.vocab_size) * H;
  return m.num_hidden_layers * (per_layer + expert * experts_on_rank) + 2 * embed + 2 * H;
}

uint64_t KvBytesPerToken(const ModelConfig& m, int tp_size) {
  const uint64_t kv_heads = static_cast<uint64_t>(m.num_key_value_heads / tp_size);
  return static_cast<uint64_t>(m.num_hidden_layers) * 2 * kv_heads * m.head_dim * 2;
}

GpuRankNeed EstimateGpuRankNeed(const ModelConfig& model, int tp_size, int experts_on_rank) {
  GpuRankNeed need;
  need.weights = EstimateRankBytes(model, tp_size, experts_on_rank);
  need.kv_minimum = KvBytesPerToken(model, tp_size) * kMinKvTokens;
  need.runtime = kGpuRuntimeBytes;
  need.shard = absl::StrCat("tp ", tp_size, ": ", model.num_attention_heads / tp_size, " of ",
                            model.num_attention_heads, " attention heads, ", experts_on_rank,
                            " of ", model.num_local_experts, " experts per layer");
  return need;
}

absl::Status CheckGpuMemory(const std::vector<const WorkerDesc*>& rank_workers,
                            const std::vector<GpuRankNeed>& needs) {
  for (const auto& [key, use] : GroupByGpu(rank_workers)) {
    if (use.total_bytes == 0) continue;  // size unknown: nothing to check against
    uint64_t need = 0, resident = 0;
    for (int r : use.ranks) {
      need += needs[r].total();
      resident += needs[r].weights + needs[r].kv_minimum;
    }
    if (use.shares > 1.0 + 1e-9) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "%s; their --gpu-memory-utilization shares add up to %.2f of the GPU: give each at "
          "most %.2f",
          WhoNeeds(use, rank_workers, needs, absl::StrFormat("%.2f of its memory", use.shares)),
          use.shares, 1.0 / static_cast<double>(use.ranks.size())));
    }
    // Ranks sharing a GPU: each must fit its own share, and all of them the GPU.
    for (int r : use.ranks.size() > 1 ? use.ranks : std::vector<int>{}) {
      const double share = RankShare(*rank_workers[r]);
      const auto own = static_cast<uint64_t>(static_cast<double>(use.total_bytes) * share);
      if (needs[r].total() > own) {
        return absl::ResourceExhaustedError(absl::StrFormat(
            "rank %d (worker '%s') needs about %s (%s); its share of the GPU's %s at gpu memory "
            "utilization %.2f is %s; raise --gpu-memory-utilization or use a larger GPU",
            r, rank_workers[r]->worker_id, GiB(needs[r].total()), DescribeNeed(needs[r]),
            GiB(use.total_bytes), share, GiB(own)));
      }
    }
    const auto usable =
        static_cast<uint64_t>(static_cast<double>(use.total_bytes) * use.utilization);
    if (need > usable) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "%s; the GPU has %s, %s of it usable at gpu memory utilization %.2f (a GPU of at least "
          "%s would do); %s",
          WhoNeeds(use, rank_workers, needs, absl::StrCat("about ", GiB(need))),
          GiB(use.total_bytes), GiB(usable), use.utilization,
          GiB(static_cast<uint64_t>(static_cast<double>(need) / use.utilization)),
          Advice(use, false)));
    }
    // Another process on the GPU takes memory the engines will not get.
    if (use.free_bytes > 0 && resident > use.free_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          WhoNeeds(use, rank_workers, needs, absl::StrCat(GiB(resident), " for weights and KV")),
          "; only ", GiB(use.free_bytes), " of its ", GiB(use.total_bytes),
          " was free when the workers registered (other processes hold the rest); ",
          Advice(use, true)));
    }
  }
  return absl::OkStatus();
}

}  // namespace flotilla::coordinator
