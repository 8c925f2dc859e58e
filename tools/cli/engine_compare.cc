#include "tools/cli/engine_compare.h"

#include <algorithm>

namespace flotilla::cli {
namespace {

nlohmann::json MeasurementJson(const cluster::EngineMeasurement& m) {
  nlohmann::json j;
  j["worker_id"] = m.worker_id();
  j["engine"] = m.engine();
  j["device"] = m.device().name();
  j["running_sequences"] = m.running_sequences();
  j["wall_ms"] = m.wall_ms();
  j["world_size"] = std::max<uint32_t>(1, m.world_size());
  j["tp_size"] = std::max<uint32_t>(1, m.tp_size());
  j["dp_groups"] = std::max<uint32_t>(1, m.dp_groups());
  j["decode"] = nlohmann::json::array();
  for (const cluster::DecodeTiming& d : m.decode()) {
    j["decode"].push_back({{"batch", d.batch()},
                           {"context_tokens", d.context_tokens()},
                           {"steps", d.steps()},
                           {"step_ms_p50", d.step_ms_p50()},
                           {"step_ms_mean", d.step_ms_mean()},
                           {"step_ms_min", d.step_ms_min()}});
  }
  j["prefill"] = nlohmann::json::array();
  for (const cluster::PrefillTiming& p : m.prefill()) {
    j["prefill"].push_back({{"prompt_tokens", p.prompt_tokens()},
                            {"chunk_tokens", p.chunk_tokens()},
                            {"ms_p50", p.ms_p50()},
                            {"ms_min", p.ms_min()}});
  }
  return j;
}

// The largest measured batch not above `batch` (the smallest one if none).
const cluster::DecodeTiming* DecodeAt(const cluster::EngineMeasurement& m, int batch) {
  const cluster::DecodeTiming* fit = nullptr;
  const cluster::DecodeTiming* smallest = nullptr;
  for (const cluster::DecodeTiming& d : m.decode()) {
    if (smallest == nullptr || d.batch() < smallest->batch()) smallest = &d;
    if (static_cast<int>(d.batch()) <= batch && (fit == nullptr || d.batch() > fit->batch())) {
      fit = &d;
    }
  }
  return fit != nullptr ? fit : smallest;
}

}  // namespace

std::vector<uint32_t> CompareBatchSizes(int batch) {
  const uint32_t b = static_cast<uint32_t>(std::max(1, batch));
  uint32_t below = 1;
  while (below * 2 <= b) below *= 2;
  const uint32_t above = below == b ? b : below * 2;
  std::vector<uint32_t> out = {1, below, b, above};
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

int GroupBatch(int batch, int dp_groups) {
  const int groups = std::max(1, dp_groups);
  return std::max(1, (batch + groups - 1) / groups);
}

cluster::MeasureEngineRequest CompareRequest(const ServedLoad& load, int context_tokens,
                                             int steps) {
  cluster::MeasureEngineRequest r;
  for (uint32_t b : CompareBatchSizes(GroupBatch(load.batch, load.dp_groups))) {
    r.add_batch_sizes(b);
  }
  r.set_context_tokens(static_cast<uint32_t>(std::max(1, context_tokens)));
  r.add_prefill_tokens(static_cast<uint32_t>(std::max(1, load.prompt_tokens)));
  r.set_steps(static_cast<uint32_t>(std::max(1, steps)));
  return r;
}

nlohmann::json EngineComparison(const ServedLoad& load, const cluster::EngineMeasurement& m) {
  nlohmann::json out;
  out["engine"] = MeasurementJson(m);
  const int groups = static_cast<int>(std::max<uint32_t>(1, m.dp_groups()));
  const cluster::DecodeTiming* step = DecodeAt(m, GroupBatch(load.batch, groups));
  if (step == nullptr || m.prefill().empty()) return out;
  const double step_ms = step->step_ms_p50();
  const double prefill_ms = m.prefill(0).ms_p50();
  // The groups step together, each through its share of the work.
  const double decode_steps =
      static_cast<double>(std::max<int64_t>(0, load.output_tokens - load.prompts)) /
      (static_cast<double>(step->batch()) * groups);
  const double group_prompts = static_cast<double>(load.prompts) / groups;
  const double engine_s = (decode_steps * step_ms + group_prompts * prefill_ms) / 1000.0;
  const double engine_rate = engine_s > 0 ? load.output_tokens / engine_s : 0;
  const double served_rate = load.elapsed_s > 0 ? load.output_tokens / load.elapsed_s : 0;
  nlohmann::json c;
  c["dp_groups"] = groups;
  c["batch"] = step->batch();
  c["itl_p50_ms"] = load.itl_p50_ms;
  c["engine_step_ms"] = step_ms;
  c["itl_over_engine_step"] = step_ms > 0 ? load.itl_p50_ms / step_ms : 0;
  c["prompt_tokens"] = m.prefill(0).prompt_tokens();
  c["ttft_p50_ms"] = load.ttft_p50_ms;
  c["engine_prefill_ms"] = prefill_ms;
  c["ttft_minus_engine_prefill_ms"] = load.ttft_p50_ms - prefill_ms;
  c["prompts"] = load.prompts;
  c["decode_steps"] = decode_steps;
  c["engine_output_tokens_per_s"] = engine_rate;
  c["engine_output_tokens_per_s_per_dp_group"] = engine_rate / groups;
  c["served_output_tokens_per_s"] = served_rate;
  c["served_over_engine"] = engine_rate > 0 ? served_rate / engine_rate : 0;
  out["engine_compare"] = c;
  return out;
}

}  // namespace flotilla::cli
