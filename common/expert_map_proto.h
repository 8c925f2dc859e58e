// ExpertMap <-> its wire form in cluster.proto (shared by coordinator and worker).
#pragma once

#include "absl/status/statusor.h"
#include "common/expert_map.h"
#include "proto/cluster.pb.h"

namespace flotilla {

cluster::ExpertMap ExpertMapToProto(const ExpertMap& map);
// Validates as ExpertMap::Create does.
absl::StatusOr<ExpertMap> ExpertMapFromProto(const cluster::ExpertMap& proto);

}  // namespace flotilla
