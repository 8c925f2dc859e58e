#include "coordinator/cluster/expert_load_window.h"

#include <algorithm>

namespace flotilla::coordinator {

uint64_t ExpertLoadCounts::total() const {
  uint64_t n = 0;
  for (const auto& r : by_rank) {
    for (uint64_t v : r) n += v;
  }
  return n;
}

std::vector<uint64_t> ExpertLoadCounts::ExpertTotals(int layer) const {
  std::vector<uint64_t> out(num_experts, 0);
  for (const auto& r : by_rank) {
    for (int e = 0; e < num_experts; ++e) out[e] += r[layer * num_experts + e];
  }
  return out;
}

std::vector<uint64_t> ExpertLoadCounts::RankTotals(int layer) const {
  std::vector<uint64_t> out(by_rank.size(), 0);
  for (size_t r = 0; r < by_rank.size(); ++r) {
    for (int e = 0; e < num_experts; ++e) out[r] += by_rank[r][layer * num_experts + e];
  }
  return out;
}

void ExpertLoadWindow::Reset(int world_size, int num_layers, int num_experts) {
  std::lock_guard<std::mutex> lock(mu_);
  world_size_ = world_size;
  num_layers_ = num_layers;
  num_experts_ = num_experts;
  samples_.clear();
}

void ExpertLoadWindow::Add(int rank, absl::Time at, const cluster::ExpertLoad& load) {
  std::lock_guard<std::mutex> lock(mu_);
  if (rank < 0 || rank >= world_size_ || static_cast<int>(load.num_layers()) != num_layers_ ||
      static_cast<int>(load.num_experts()) != num_experts_ ||
      load.tokens_size() != num_layers_ * num_experts_) {
    return;
  }
  // Reports of one rank and map within a second share a sample, so memory
  // stays (ranks x seconds kept) rows of counts.
  for (auto it = samples_.rbegin(); it != samples_.rend() && it->at > at - absl::Seconds(1); ++it) {
    if (it->rank == rank && it->version == load.map_version()) {
      for (int i = 0; i < load.tokens_size(); ++i) it->tokens[i] += load.tokens(i);
      return;
    }
  }
  samples_.push_back({at, rank, load.map_version(), {load.tokens().begin(), load.tokens().end()}});
  while (!samples_.empty() && samples_.front().at < at - max_age_) samples_.pop_front();
}

ExpertLoadCounts ExpertLoadWindow::Sum(absl::Time now, absl::Duration window,
                                       uint64_t version) const {
  std::lock_guard<std::mutex> lock(mu_);
  ExpertLoadCounts out;
  out.num_layers = num_layers_;
  out.num_experts = num_experts_;
  out.by_rank.assign(world_size_, std::vector<uint64_t>(num_layers_ * num_experts_, 0));
  absl::Time oldest = now;
  for (const Sample& s : samples_) {
    if (s.at <= now - window || s.at > now || s.version != version) continue;
    for (size_t i = 0; i < s.tokens.size(); ++i) out.by_rank[s.rank][i] += s.tokens[i];
    oldest = std::min(oldest, s.at);
    ++out.samples;
  }
  out.span = now - oldest;
  return out;
}

double Imbalance(const std::vector<double>& loads) {
  if (loads.empty()) return 0;
  double sum = 0, max = 0;
  for (double v : loads) {
    sum += v;
    max = std::max(max, v);
  }
  return sum > 0 ? max / (sum / loads.size()) : 0;
}

}  // namespace flotilla::coordinator
