// Instance's expert balancing: the load window's reports, the
// balancer's plans, the two-phase expert-map switch, automatic rebalancing
// and the drained DP groups.
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/expert_map_proto.h"
#include "common/status.h"
#include "coordinator/cluster/balancer.h"
#include "coordinator/cluster/instance.h"
#include "spdlog/spdlog.h"

namespace flotilla::coordinator {
namespace {

// Bytes of one MXFP4 expert: gate_up [2I, H] and down [H, I] (16 bytes of
// nibbles and one scale per 32 inputs) and their bf16 biases.
uint64_t ExpertBytes(const ModelConfig& c) {
  const uint64_t H = c.hidden_size, I = c.intermediate_size;
  return 2 * I * (H / 32) * 17 + H * (I / 32) * 17 + (2 * I + H) * 2;
}

cluster::CoordinatorMessage MapUpdate(cluster::ExpertMapUpdate::Phase phase, const ExpertMap& map) {
  cluster::CoordinatorMessage msg;
  cluster::ExpertMapUpdate* u = msg.mutable_expert_map();
  u->set_phase(phase);
  if (phase == cluster::ExpertMapUpdate::PREPARE) {
    *u->mutable_map() = ExpertMapToProto(map);
  } else {
    u->mutable_map()->set_version(map.version());  // COMMIT / ABORT name the version
  }
  return msg;
}

}  // namespace

void Instance::SendToRanksLocked(const cluster::CoordinatorMessage& message) {
  for (const RankPlacement& r : placement_->ranks) {
    Worker& w = workers_[r.worker_id];
    if (w.session) w.session->Send(message);
  }
}

void Instance::OnExpertMapPreparedLocked(const Worker& w,
                                               const cluster::ExpertMapPrepared& prepared) {
  if (!map_switch_ || map_switch_->version != prepared.version() || w.rank < 0) return;
  if (!prepared.error().empty()) {
    map_switch_->error = absl::StrCat("rank ", w.rank, " (", w.worker_id, "): ", prepared.error());
  } else {
    map_switch_->prepared.insert(w.rank);
    map_switch_->bytes += prepared.bytes_loaded();
  }
  map_switch_cv_.notify_all();
}

absl::Status Instance::CheckExpertMapLocked(const ExpertMap& map) const {
  if (!placement_ || state_ != admin::READY) {
    return absl::UnavailableError(absl::StrCat("the instance is not serving: ", state_message_));
  }
  FLOTILLA_RETURN_IF_ERROR(CheckBalancingAppliesLocked());
  const ExpertMap& cur = placement_->expert_map;
  if (map.version() != cur.version() + 1) {
    return absl::FailedPreconditionError(
        absl::StrCat("expert map version must be ", cur.version() + 1, ", got ", map.version()));
  }
  if (map.world_size() != cur.world_size() || map.num_layers() != cur.num_layers() ||
      map.num_experts() != cur.num_experts()) {
    return absl::InvalidArgumentError(
        absl::StrCat("expert map shape ", map.num_layers(), " layers x ", map.num_experts(),
                     " experts over ", map.world_size(), " ranks does not match ", cur.num_layers(),
                     " x ", cur.num_experts(), " over ", cur.world_size()));
  }
  for (const RankPlacement& r : placement_->ranks) {
    const Worker& w = workers_.at(r.worker_id);
    const int slots = static_cast<int>(w.ready.expert_slots());
    for (int l = 0; l < map.num_layers(); ++l) {
      for (int e = 0; e < map.num_experts(); ++e) {
        for (const ExpertLocation& at : map.replicas(l, e)) {
          if (at.rank == r.rank && at.slot >= slots) {
            return absl::InvalidArgumentError(absl::StrCat(
                "layer ", l, " expert ", e, " is placed in slot ", at.slot, " of rank ", r.rank,
                ", which has ", slots, " expert slots (its experts and --redundant-experts)"));
          }
        }
      }
    }
  }
  return absl::OkStatus();
}

absl::Status Instance::CheckBalancingAppliesLocked() const {
  if (placement_->parallel.moe_tp()) {
    return absl::FailedPreconditionError(
        "expert balancing moves whole experts between ranks (the expert-parallel MoE layout); "
        "this instance runs the tensor-parallel MoE layout, where every rank holds a slice of "
        "every expert, so there is nothing to balance");
  }
  return absl::OkStatus();
}

absl::Status Instance::ApplyExpertMap(const ExpertMap& map) {
  std::unique_lock<std::mutex> lock(mu_);
  FLOTILLA_RETURN_IF_ERROR(CheckExpertMapLocked(map));
  map_switch_ = MapSwitch{map.version(), generation_, {}, {}, 0};
  SendToRanksLocked(MapUpdate(cluster::ExpertMapUpdate::PREPARE, map));
  const size_t world = placement_->ranks.size();
  const bool settled = map_switch_cv_.wait_for(
      lock, absl::ToChronoNanoseconds(options_.expert_map_prepare_timeout), [&] {
        return !map_switch_->error.empty() || map_switch_->prepared.size() == world ||
               generation_ != map_switch_->generation || state_ != admin::READY || stop_;
      });
  std::string why = map_switch_->error;
  if (why.empty() && !settled) why = "ranks did not prepare in time";
  if (why.empty() && stop_) why = "the coordinator is stopping";
  if (why.empty() && (generation_ != map_switch_->generation || state_ != admin::READY)) {
    why = absl::StrCat("the instance changed while preparing: ", state_message_);
  }
  if (!why.empty()) {
    if (placement_) SendToRanksLocked(MapUpdate(cluster::ExpertMapUpdate::ABORT, map));
    map_switch_.reset();
    spdlog::warn("expert map {} aborted: {}", map.version(), why);
    return absl::AbortedError(absl::StrCat("expert map ", map.version(), " aborted: ", why));
  }
  const uint64_t bytes = map_switch_->bytes;
  map_switch_.reset();
  placement_->expert_map = map;
  SendToRanksLocked(MapUpdate(cluster::ExpertMapUpdate::COMMIT, map));
  spdlog::info("expert map {} committed on {} ranks ({} KiB of experts loaded)", map.version(),
               world, bytes >> 10);
  return absl::OkStatus();
}

absl::StatusOr<cluster::ExpertMap> Instance::SetExpertMap(const cluster::ExpertMap& proto) {
  FLOTILLA_ASSIGN_OR_RETURN(ExpertMap map, ExpertMapFromProto(proto));
  std::lock_guard<std::mutex> one_at_a_time(rebalance_mu_);
  FLOTILLA_RETURN_IF_ERROR(ApplyExpertMap(map));
  return ExpertMapToProto(map);
}

absl::StatusOr<admin::ExpertLoadReport> Instance::ExpertLoad(
    const admin::ExpertLoadRequest& request) const {
  if (request.window_seconds() < 0 || request.window_seconds() > 60) {
    return absl::InvalidArgumentError("window_seconds must be in [0, 60] (0: the default)");
  }
  ExpertMap map;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!placement_)
      return absl::UnavailableError(absl::StrCat("no placement yet: ", state_message_));
    map = placement_->expert_map;
  }
  if (!request.all_layers() && (request.layer() < -1 || request.layer() >= map.num_layers())) {
    return absl::InvalidArgumentError(
        absl::StrCat("layer ", request.layer(), " is not in [0, ", map.num_layers(), ")"));
  }
  const absl::Duration window = request.window_seconds() > 0
                                    ? absl::Seconds(request.window_seconds())
                                    : options_.expert_window;
  const ExpertLoadCounts counts = expert_window_.Sum(absl::Now(), window, map.version());
  admin::ExpertLoadReport report;
  report.set_window_seconds(absl::ToDoubleSeconds(std::min(window, counts.span)));
  report.set_map_version(map.version());
  report.set_num_layers(map.num_layers());
  report.set_num_experts(map.num_experts());
  report.set_world_size(map.world_size());
  std::vector<uint64_t> ranks_total(map.world_size(), 0);
  double sum = 0, max = 0;
  int loaded = 0;
  for (int l = 0; l < map.num_layers(); ++l) {
    const std::vector<uint64_t> ranks = counts.RankTotals(l);
    std::vector<double> as_double(ranks.begin(), ranks.end());
    const double imbalance = Imbalance(as_double);
    for (size_t r = 0; r < ranks.size(); ++r) ranks_total[r] += ranks[r];
    if (imbalance > 0) {
      sum += imbalance;
      max = std::max(max, imbalance);
      ++loaded;
    }
    const bool wanted = request.all_layers() || request.layer() < 0 || request.layer() == l;
    if (!wanted) continue;
    admin::LayerLoad* ll = report.add_layers();
    ll->set_layer(l);
    ll->mutable_rank_tokens()->Assign(ranks.begin(), ranks.end());
    const std::vector<uint64_t> experts = counts.ExpertTotals(l);
    ll->mutable_expert_tokens()->Assign(experts.begin(), experts.end());
    ll->set_imbalance(imbalance);
  }
  report.set_imbalance(loaded > 0 ? sum / loaded : 0);
  report.set_max_layer_imbalance(max);
  report.mutable_rank_tokens()->Assign(ranks_total.begin(), ranks_total.end());
  report.set_total_tokens(counts.total());
  return report;
}

absl::StatusOr<admin::RebalanceResult> Instance::Rebalance(
    const admin::RebalanceRequest& request) {
  if (request.window_seconds() < 0 || request.window_seconds() > 60) {
    return absl::InvalidArgumentError("window_seconds must be in [0, 60] (0: the default)");
  }
  const absl::Time start = absl::Now();
  std::lock_guard<std::mutex> one_at_a_time(rebalance_mu_);
  BalancerInput in;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!placement_ || state_ != admin::READY || !loaded_map_) {
      return absl::UnavailableError(absl::StrCat("the instance is not serving: ", state_message_));
    }
    FLOTILLA_RETURN_IF_ERROR(CheckBalancingAppliesLocked());
    in.current = placement_->expert_map;
    in.base = *loaded_map_;
    for (const RankPlacement& r : placement_->ranks) {
      in.slots_per_rank.push_back(static_cast<int>(workers_[r.worker_id].ready.expert_slots()));
    }
  }
  in.expert_bytes = ExpertBytes(options_.model);
  in.max_bytes = request.max_bytes() > 0 ? request.max_bytes() : options_.rebalance_max_bytes;
  const absl::Duration window = request.window_seconds() > 0
                                    ? absl::Seconds(request.window_seconds())
                                    : options_.expert_window;
  const ExpertLoadCounts counts = expert_window_.Sum(absl::Now(), window, in.current.version());
  for (int l = 0; l < in.current.num_layers(); ++l) {
    const std::vector<uint64_t> e = counts.ExpertTotals(l);
    in.load.emplace_back(e.begin(), e.end());
  }
  FLOTILLA_ASSIGN_OR_RETURN(BalancerPlan plan, PlanRebalance(in));
  admin::RebalanceResult result;
  result.set_version_before(in.current.version());
  result.set_version_after(in.current.version());
  result.set_imbalance_before(plan.imbalance_before);
  result.set_imbalance_after(plan.imbalance_after);
  result.set_bytes_moved(plan.bytes_moved);
  result.set_replicas_added(plan.replicas_added);
  result.set_replicas_removed(plan.replicas_removed);
  *result.mutable_map() = ExpertMapToProto(plan.map);
  if (counts.total() == 0) {
    result.set_message("no expert load in the window: nothing to plan from");
  } else if (!plan.changed) {
    result.set_message("the current map is already the plan");
  } else if (request.dry_run()) {
    result.set_message("dry run: not applied");
  } else {
    FLOTILLA_RETURN_IF_ERROR(ApplyExpertMap(plan.map));
    result.set_applied(true);
    result.set_version_after(plan.map.version());
    result.set_message("applied");
  }
  result.set_duration_ms(absl::ToDoubleMilliseconds(absl::Now() - start));
  spdlog::info("rebalance: version {} -> {}, imbalance {:.3f} -> {:.3f}, {} bytes, {}",
               result.version_before(), result.version_after(), result.imbalance_before(),
               result.imbalance_after(), result.bytes_moved(), result.message());
  return result;
}

void Instance::AutoRebalanceLoop() {
  while (true) {
    {
      std::unique_lock<std::mutex> lock(monitor_mu_);
      monitor_cv_.wait_for(lock, absl::ToChronoNanoseconds(options_.rebalance_interval),
                           [this] { return stop_.load(); });
      if (stop_) return;
    }
    admin::ExpertLoadRequest ask;
    ask.set_all_layers(true);
    absl::StatusOr<admin::ExpertLoadReport> load = ExpertLoad(ask);
    if (!load.ok() || load->imbalance() < options_.rebalance_min_imbalance) continue;
    absl::StatusOr<admin::RebalanceResult> r = Rebalance(admin::RebalanceRequest());
    if (absl::IsFailedPrecondition(r.status())) continue;  // the tensor-parallel MoE layout
    if (!r.ok()) spdlog::warn("automatic rebalance failed: {}", r.status().ToString());
  }
}

int Instance::ChooseGroupLocked() const {
  int group = -1;
  for (int g = 0; g < static_cast<int>(group_inflight_.size()); ++g) {
    if (drained_groups_.count(g)) continue;
    if (group < 0 || group_inflight_[g] < group_inflight_[group]) group = g;
  }
  return group;
}

absl::StatusOr<admin::DrainResult> Instance::Drain(const std::string& worker_id,
                                                         bool drained) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) {
    return absl::NotFoundError(absl::StrCat("no worker '", worker_id, "'"));
  }
  if (!placement_ || it->second.rank < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker '", worker_id, "' holds no rank of the placement"));
  }
  const int group = placement_->parallel.dp_group_of(it->second.rank);
  if (drained) {
    drained_groups_.insert(group);
  } else {
    drained_groups_.erase(group);
  }
  spdlog::info("DP group {} (worker {}) {}", group, worker_id, drained ? "drained" : "undrained");
  admin::DrainResult result;
  result.set_worker_id(worker_id);
  result.set_dp_group(group);
  result.set_drained(drained);
  if (group < static_cast<int>(group_inflight_.size())) {
    result.set_requests_in_flight(group_inflight_[group]);
  }
  return result;
}

void Instance::AddDrainStatusLocked(admin::ClusterStatus* status) const {
  if (placement_) status->set_expert_map_version(placement_->expert_map.version());
  for (int g : drained_groups_) status->add_drained_groups(g);
  for (admin::WorkerStatus& ws : *status->mutable_workers()) {
    const bool placed = placement_ && ws.rank() >= 0;
    const int group = placed ? placement_->parallel.dp_group_of(ws.rank()) : -1;
    ws.set_dp_group(group);
    ws.set_drained(group >= 0 && drained_groups_.count(group) > 0);
  }
}

}  // namespace flotilla::coordinator
