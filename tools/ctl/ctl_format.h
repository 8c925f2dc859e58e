// flotillactl's output: readable tables, or one JSON object per answer
// (--json; numbers as numbers, field names as in admin.proto).
#pragma once

#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "proto/admin.pb.h"

namespace flotilla::ctl {

// Left-aligned columns, two spaces apart.
std::string Table(const std::vector<std::string>& header,
                  const std::vector<std::vector<std::string>>& rows);

nlohmann::json StatusJson(const admin::ClusterStatus& status,
                          const admin::PlacementInfo* placement);
std::string StatusTable(const admin::ClusterStatus& status, const admin::PlacementInfo* placement);

nlohmann::json ExpertLoadJson(const admin::ExpertLoadReport& report);
std::string ExpertLoadTable(const admin::ExpertLoadReport& report);

nlohmann::json RebalanceJson(const admin::RebalanceResult& result);
std::string RebalanceText(const admin::RebalanceResult& result);

nlohmann::json DrainJson(const admin::DrainResult& result);

// A message as JSON (proto3 mapping, proto field names).
std::string ProtoJson(const google::protobuf::Message& message);

}  // namespace flotilla::ctl
