#include "coordinator/prepared_request.h"

namespace flotilla::coordinator {

std::vector<std::vector<tokenizer::TokenId>> Prompts(const PreparedRequest& request) {
  if (!request.batch.empty()) return request.batch;
  return {request.prompt};
}

}  // namespace flotilla::coordinator
