#include "coordinator/cluster/expert_metrics.h"

#include "absl/strings/str_cat.h"

namespace flotilla::coordinator {

std::string RenderExpertMetrics(const ClusterManager& manager, const std::string& labels) {
  const std::string alone = labels.empty() ? "" : absl::StrCat("{", labels, "}");
  const std::string first = labels.empty() ? "" : labels + ",";
  admin::ExpertLoadRequest ask;
  ask.set_all_layers(true);
  absl::StatusOr<admin::ExpertLoadReport> r = manager.ExpertLoad(ask);
  if (!r.ok()) return "";
  std::string out;
  absl::StrAppend(&out,
                  "# HELP flotilla_expert_map_version the expert map in force\n"
                  "# TYPE flotilla_expert_map_version gauge\n"
                  "flotilla_expert_map_version",
                  alone, " ", r->map_version(), "\n");
  absl::StrAppend(&out,
                  "# HELP flotilla_expert_imbalance max / mean rank expert load over the window, "
                  "mean over layers\n# TYPE flotilla_expert_imbalance gauge\n"
                  "flotilla_expert_imbalance",
                  alone, " ", r->imbalance(), "\n");
  absl::StrAppend(&out,
                  "# HELP flotilla_expert_layer_imbalance max / mean rank expert load of a layer "
                  "over the window\n# TYPE flotilla_expert_layer_imbalance gauge\n");
  for (const admin::LayerLoad& l : r->layers()) {
    absl::StrAppend(&out, "flotilla_expert_layer_imbalance{", first, "layer=\"", l.layer(), "\"} ",
                    l.imbalance(), "\n");
  }
  absl::StrAppend(&out,
                  "# HELP flotilla_expert_rank_tokens expert rows a rank ran over the window "
                  "(all layers)\n# TYPE flotilla_expert_rank_tokens gauge\n");
  for (int rank = 0; rank < r->rank_tokens_size(); ++rank) {
    absl::StrAppend(&out, "flotilla_expert_rank_tokens{", first, "rank=\"", rank, "\"} ", r->rank_tokens(rank),
                    "\n");
  }
  return out;
}

}  // namespace flotilla::coordinator
