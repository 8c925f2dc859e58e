// The expert-balancing part of /metrics: the expert-map version, each
// layer's imbalance and each rank's expert load over the default window.
#pragma once

#include <string>

#include "coordinator/cluster/cluster_manager.h"

namespace flotilla::coordinator {

// Every series carries `labels` (model_name="...", like the rest of
// /metrics); empty: none.
std::string RenderExpertMetrics(const ClusterManager& manager, const std::string& labels = "");

}  // namespace flotilla::coordinator
