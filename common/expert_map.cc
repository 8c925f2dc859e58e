#include "common/expert_map.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"

namespace flotilla {

absl::StatusOr<ExpertMap> ExpertMap::Contiguous(int num_layers, int num_experts, int world_size,
                                                uint64_t version) {
  if (num_layers < 1 || num_experts < 1 || world_size < 1) {
    return absl::InvalidArgumentError("expert map needs layers, experts and ranks >= 1");
  }
  if (world_size > num_experts) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot spread ", num_experts, " experts over ", world_size, " ranks: some would hold none"));
  }
  std::vector<std::vector<ExpertLocation>> layer(num_experts);
  const int base = num_experts / world_size;
  const int extra = num_experts % world_size;
  int expert = 0;
  for (int r = 0; r < world_size; ++r) {
    const int count = base + (r < extra ? 1 : 0);
    for (int s = 0; s < count; ++s) layer[expert++] = {ExpertLocation{r, s}};
  }
  return Create(version, world_size,
                std::vector<std::vector<std::vector<ExpertLocation>>>(num_layers, layer));
}

absl::StatusOr<ExpertMap> ExpertMap::Create(
    uint64_t version, int world_size,
    std::vector<std::vector<std::vector<ExpertLocation>>> locations) {
  if (locations.empty()) return absl::InvalidArgumentError("expert map has no layers");
  const size_t experts = locations[0].size();
  for (size_t l = 0; l < locations.size(); ++l) {
    if (locations[l].size() != experts) {
      return absl::InvalidArgumentError(absl::StrCat("expert map layer ", l, " has ",
                                                     locations[l].size(), " experts, layer 0 has ",
                                                     experts));
    }
    std::set<std::pair<int, int>> used;
    for (size_t e = 0; e < experts; ++e) {
      if (locations[l][e].empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("expert map: layer ", l, " expert ", e, " has no replica"));
      }
      for (const ExpertLocation& loc : locations[l][e]) {
        if (loc.rank < 0 || loc.rank >= world_size || loc.slot < 0) {
          return absl::InvalidArgumentError(absl::StrCat("expert map: layer ", l, " expert ", e,
                                                         " placed on rank ", loc.rank, " slot ",
                                                         loc.slot, " (world size ", world_size, ")"));
        }
        if (!used.insert({loc.rank, loc.slot}).second) {
          return absl::InvalidArgumentError(absl::StrCat("expert map: layer ", l, " rank ",
                                                         loc.rank, " slot ", loc.slot,
                                                         " holds two experts"));
        }
      }
    }
  }
  ExpertMap m;
  m.version_ = version;
  m.world_size_ = world_size;
  m.locations_ = std::move(locations);
  return m;
}

std::vector<int> ExpertMap::ExpertsOnRank(int layer, int rank) const {
  std::vector<std::pair<int, int>> slot_expert;
  for (int e = 0; e < num_experts(); ++e) {
    for (const ExpertLocation& loc : locations_[layer][e]) {
      if (loc.rank == rank) slot_expert.push_back({loc.slot, e});
    }
  }
  std::sort(slot_expert.begin(), slot_expert.end());
  std::vector<int> out;
  for (auto& [slot, e] : slot_expert) out.push_back(e);
  return out;
}

int ExpertMap::SlotsOnRank(int layer, int rank) const {
  int n = 0;
  for (int e = 0; e < num_experts(); ++e) {
    for (const ExpertLocation& loc : locations_[layer][e]) {
      if (loc.rank == rank && loc.slot + 1 > n) n = loc.slot + 1;
    }
  }
  return n;
}

}  // namespace flotilla
