#include "tools/ctl/ctl_format.h"

#include <google/protobuf/util/json_util.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/comm_names.h"

namespace flotilla::ctl {
namespace {

using nlohmann::json;

std::string Fixed(double v, int digits = 2) { return absl::StrFormat("%.*f", digits, v); }

std::string StateName(admin::InstanceState s) { return admin::InstanceState_Name(s); }

}  // namespace

std::string Table(const std::vector<std::string>& header,
                  const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width(header.size(), 0);
  for (size_t c = 0; c < header.size(); ++c) width[c] = header[c].size();
  for (const auto& row : rows) {
    for (size_t c = 0; c < row.size() && c < width.size(); ++c) {
      width[c] = std::max(width[c], row[c].size());
    }
  }
  std::string out;
  auto line = [&](const std::vector<std::string>& cells) {
    std::string text;
    for (size_t c = 0; c < cells.size(); ++c) {
      text += cells[c];
      if (c + 1 < cells.size()) text += std::string(width[c] - cells[c].size() + 2, ' ');
    }
    out += text + "\n";
  };
  line(header);
  for (const auto& row : rows) line(row);
  return out;
}

std::string ProtoJson(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions o;
  o.always_print_primitive_fields = true;
  o.preserve_proto_field_names = true;
  std::string out;
  (void)google::protobuf::util::MessageToJsonString(message, &out, o);
  return out;
}

json StatusJson(const admin::ClusterStatus& s, const admin::PlacementInfo* placement) {
  json j = {{"state", StateName(s.state())},
            {"message", s.message()},
            {"model", s.model()},
            {"generation", s.generation()},
            {"expert_map_version", s.expert_map_version()},
            {"requests_in_flight", s.requests_in_flight()},
            {"requests_submitted", s.requests_submitted()},
            {"drained_groups", json::array()},
            {"requests_migrated", s.requests_migrated()},
            {"instances", json::array()},
            {"workers", json::array()}};
  for (const admin::InstanceStatus& i : s.instances()) {
    j["instances"].push_back({{"instance", i.id()},
                              {"state", StateName(i.state())},
                              {"message", i.message()},
                              {"drained", i.drained()},
                              {"generation", i.generation()},
                              {"requests_in_flight", i.requests_in_flight()},
                              {"kv_blocks_free", i.kv_blocks_free()},
                              {"kv_blocks_total", i.kv_blocks_total()}});
  }
  for (uint32_t g : s.drained_groups()) j["drained_groups"].push_back(g);
  for (const admin::WorkerStatus& w : s.workers()) {
    j["workers"].push_back({{"worker_id", w.worker_id()},
                            {"instance", w.instance()},
                            {"node", w.node()},
                            {"device", w.device().name()},
                            {"device_memory_bytes", w.device().memory_bytes()},
                            {"rank", w.rank()},
                            {"dp_group", w.dp_group()},
                            {"alive", w.alive()},
                            {"drained", w.drained()},
                            {"heartbeat_age_ms", w.last_heartbeat_age_ms()},
                            {"steps", w.load().steps()},
                            {"running", w.load().running_sequences()},
                            {"queued", w.load().queued_sequences()},
                            {"kv_blocks_free", w.load().kv_blocks_free()},
                            {"kv_blocks_total", w.load().kv_blocks_total()}});
  }
  if (placement != nullptr) {
    j["placement"] = {
        {"world_size", placement->world_size()},
        {"tp_size", placement->tp_size()},
        {"dp_size", placement->dp_size()},
        {"ep_size", placement->ep_size()},
        {"device_transport", placement->device_transport() == cluster::DEVICE_TRANSPORT_UNSPECIFIED
                                 ? ""
                                 : DeviceTransportName(placement->device_transport())},
        {"moe_layout", placement->moe_layout() == cluster::MOE_LAYOUT_TP ? "tp" : "ep"}};
  }
  return j;
}

std::string StatusTable(const admin::ClusterStatus& s, const admin::PlacementInfo* placement) {
  std::string out = absl::StrCat("state: ", StateName(s.state()), " (", s.message(), ")\n",
                                 "model: ", s.model(), "  generation: ", s.generation(),
                                 "  expert map: v", s.expert_map_version(), "\n");
  if (placement != nullptr) {
    absl::StrAppend(
        &out, "placement: ", placement->world_size(), " ranks, tp ", placement->tp_size(), " x dp ",
        placement->dp_size(), ", ep ", placement->ep_size(), ", MoE ",
        placement->moe_layout() == cluster::MOE_LAYOUT_TP ? "tensor" : "expert", " parallel\n");
  }
  absl::StrAppend(&out, "requests: ", s.requests_in_flight(), " in flight, ",
                  s.requests_submitted(), " submitted, ", s.requests_migrated(),
                  " moved between instances\n\n");
  if (s.instances_size() > 1) {
    std::vector<std::vector<std::string>> inst;
    for (const admin::InstanceStatus& i : s.instances()) {
      inst.push_back({absl::StrCat(i.id()), i.drained() ? "DRAINED" : StateName(i.state()),
                      absl::StrCat(i.requests_in_flight()), absl::StrCat(i.generation()),
                      i.message()});
    }
    out += Table({"INSTANCE", "STATE", "IN FLIGHT", "GENERATION", "MESSAGE"}, inst);
    out += "\n";
  }
  std::vector<std::vector<std::string>> rows;
  for (const admin::WorkerStatus& w : s.workers()) {
    const auto& l = w.load();
    const double kv = l.kv_blocks_total() == 0
                          ? 0
                          : 100.0 * (1.0 - static_cast<double>(l.kv_blocks_free()) /
                                               static_cast<double>(l.kv_blocks_total()));
    rows.push_back(
        {w.worker_id(), absl::StrCat(w.instance()), w.rank() < 0 ? "-" : absl::StrCat(w.rank()),
         w.dp_group() < 0 ? "-" : absl::StrCat(w.dp_group()),
         w.device().name().empty() ? "cpu" : w.device().name(),
         w.device().memory_bytes() == 0 ? "-"
                                        : absl::StrCat(w.device().memory_bytes() >> 30, " GiB"),
         w.alive() ? (w.drained() ? "drained" : "alive") : "dead",
         absl::StrCat(w.last_heartbeat_age_ms(), " ms"), absl::StrCat(l.steps()),
         absl::StrCat(l.running_sequences(), "/", l.queued_sequences()), Fixed(kv, 1) + "%"});
  }
  out += Table({"WORKER", "INSTANCE", "RANK", "DP", "DEVICE", "MEMORY", "STATE", "HEARTBEAT", "STEPS",
                "RUN/QUEUE", "KV USED"},
               rows);
  return out;
}

json ExpertLoadJson(const admin::ExpertLoadReport& r) {
  json j = {
      {"window_seconds", r.window_seconds()},
      {"map_version", r.map_version()},
      {"num_layers", r.num_layers()},
      {"num_experts", r.num_experts()},
      {"world_size", r.world_size()},
      {"imbalance", r.imbalance()},
      {"max_layer_imbalance", r.max_layer_imbalance()},
      {"total_tokens", r.total_tokens()},
      {"rank_tokens", json(std::vector<uint64_t>(r.rank_tokens().begin(), r.rank_tokens().end()))},
      {"layers", json::array()}};
  for (const admin::LayerLoad& l : r.layers()) {
    j["layers"].push_back(
        {{"layer", l.layer()},
         {"imbalance", l.imbalance()},
         {"rank_tokens",
          json(std::vector<uint64_t>(l.rank_tokens().begin(), l.rank_tokens().end()))},
         {"expert_tokens",
          json(std::vector<uint64_t>(l.expert_tokens().begin(), l.expert_tokens().end()))}});
  }
  return j;
}

std::string ExpertLoadTable(const admin::ExpertLoadReport& r) {
  std::string out =
      absl::StrCat("expert map v", r.map_version(), ", window ", Fixed(r.window_seconds(), 1),
                   " s, ", r.total_tokens(), " expert rows; imbalance ", Fixed(r.imbalance()),
                   " (worst layer ", Fixed(r.max_layer_imbalance()), ")\n\n");
  std::vector<std::string> header = {"LAYER", "IMBALANCE"};
  for (uint32_t rank = 0; rank < r.world_size(); ++rank)
    header.push_back(absl::StrCat("RANK ", rank));
  header.push_back("HOTTEST EXPERTS");
  std::vector<std::vector<std::string>> rows;
  for (const admin::LayerLoad& l : r.layers()) {
    std::vector<std::string> row = {absl::StrCat(l.layer()), Fixed(l.imbalance())};
    for (uint64_t n : l.rank_tokens()) row.push_back(absl::StrCat(n));
    std::vector<int> order(l.expert_tokens_size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
    std::sort(order.begin(), order.end(),
              [&](int a, int b) { return l.expert_tokens(a) > l.expert_tokens(b); });
    std::string hot;
    for (size_t i = 0; i < order.size() && i < 3; ++i) {
      absl::StrAppend(&hot, i ? " " : "", order[i], ":", l.expert_tokens(order[i]));
    }
    row.push_back(hot);
    rows.push_back(std::move(row));
  }
  return out + Table(header, rows);
}

json RebalanceJson(const admin::RebalanceResult& r) {
  return {{"version_before", r.version_before()},
          {"version_after", r.version_after()},
          {"imbalance_before", r.imbalance_before()},
          {"imbalance_after", r.imbalance_after()},
          {"bytes_moved", r.bytes_moved()},
          {"duration_ms", r.duration_ms()},
          {"applied", r.applied()},
          {"replicas_added", r.replicas_added()},
          {"replicas_removed", r.replicas_removed()},
          {"message", r.message()}};
}

std::string RebalanceText(const admin::RebalanceResult& r) {
  std::string out =
      absl::StrCat("plan: imbalance ", Fixed(r.imbalance_before()), " -> ",
                   Fixed(r.imbalance_after()), " (predicted), +", r.replicas_added(), " / -",
                   r.replicas_removed(), " replicas, ", r.bytes_moved(), " bytes to load\n");
  std::vector<std::vector<std::string>> rows;
  for (int l = 0; l < r.map().layers_size(); ++l) {
    const auto& layer = r.map().layers(l);
    for (int e = 0; e < layer.experts_size(); ++e) {
      if (layer.experts(e).replicas_size() < 2) continue;
      std::string where;
      for (const auto& rep : layer.experts(e).replicas()) {
        absl::StrAppend(&where, where.empty() ? "" : " ", "r", rep.rank(), "/s", rep.slot());
      }
      rows.push_back({absl::StrCat(l), absl::StrCat(e), where});
    }
  }
  if (!rows.empty()) out += Table({"LAYER", "EXPERT", "REPLICAS (rank/slot)"}, rows);
  absl::StrAppend(&out, r.message(), ": version ", r.version_before(), " -> ", r.version_after(),
                  " in ", Fixed(r.duration_ms(), 0), " ms\n");
  return out;
}

json DrainJson(const admin::DrainResult& r) {
  return {{"worker_id", r.worker_id()},
          {"instance", r.instance()},
          {"dp_group", r.dp_group()},
          {"drained", r.drained()},
          {"requests_in_flight", r.requests_in_flight()}};
}

}  // namespace flotilla::ctl
