// The names a model is served under (--served-model-name) and the longest
// sequence it serves: what /v1/models, ListModels and every request's `model`
// check agree on.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/cluster/cluster_manager.h"

namespace flotilla::coordinator {

// The names requests may give as `model`: `served` (--served-model-name, in
// order) or, when it is empty, `model_id` alone. The first is the one replies
// carry. InvalidArgument for an empty or repeated name.
absl::StatusOr<std::vector<std::string>> ServedModelNames(std::vector<std::string> served,
                                                          const std::string& model_id);

// `requested` when it is one of `names`, else names[0] (whose check then
// reports the mismatch with the usual message).
const std::string& ResolveModelName(const std::vector<std::string>& names, std::string_view requested);

// The longest sequence (prompt + output) served: --max-model-len, capped by
// the model's context, or the context when it is 0.
uint64_t MaxModelLen(const ClusterOptions& options);

}  // namespace flotilla::coordinator
