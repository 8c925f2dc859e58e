#include "coordinator/served_models.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace flotilla::coordinator {

absl::StatusOr<std::vector<std::string>> ServedModelNames(std::vector<std::string> served,
                                                          const std::string& model_id) {
  if (served.empty()) return std::vector<std::string>{model_id};
  for (size_t i = 0; i < served.size(); ++i) {
    if (served[i].empty()) return absl::InvalidArgumentError("--served-model-name: a name is empty");
    if (std::find(served.begin(), served.begin() + i, served[i]) != served.begin() + i) {
      return absl::InvalidArgumentError(absl::StrCat("--served-model-name: '", served[i], "' is given twice"));
    }
  }
  return served;
}

const std::string& ResolveModelName(const std::vector<std::string>& names, std::string_view requested) {
  for (const std::string& name : names) {
    if (name == requested) return name;
  }
  return names.front();
}

uint64_t MaxModelLen(const ClusterOptions& options) {
  const uint64_t context = options.model.max_position_embeddings;
  return options.max_model_len > 0 ? std::min<uint64_t>(options.max_model_len, context) : context;
}

}  // namespace flotilla::coordinator
