#include "common/expert_map_proto.h"

namespace flotilla {

cluster::ExpertMap ExpertMapToProto(const ExpertMap& map) {
  cluster::ExpertMap out;
  out.set_version(map.version());
  out.set_world_size(map.world_size());
  for (const auto& layer : map.locations()) {
    cluster::LayerExpertMap* l = out.add_layers();
    for (const auto& replicas : layer) {
      cluster::ExpertReplicas* e = l->add_experts();
      for (const ExpertLocation& loc : replicas) {
        cluster::ExpertReplica* r = e->add_replicas();
        r->set_rank(loc.rank);
        r->set_slot(loc.slot);
      }
    }
  }
  return out;
}

absl::StatusOr<ExpertMap> ExpertMapFromProto(const cluster::ExpertMap& proto) {
  std::vector<std::vector<std::vector<ExpertLocation>>> locations;
  for (const cluster::LayerExpertMap& l : proto.layers()) {
    auto& layer = locations.emplace_back();
    for (const cluster::ExpertReplicas& e : l.experts()) {
      auto& replicas = layer.emplace_back();
      for (const cluster::ExpertReplica& r : e.replicas()) {
        replicas.push_back(ExpertLocation{static_cast<int>(r.rank()), static_cast<int>(r.slot())});
      }
    }
  }
  return ExpertMap::Create(proto.version(), static_cast<int>(proto.world_size()),
                           std::move(locations));
}

}  // namespace flotilla
