// The HTTP driver of POST /v1/responses: parses and prepares the request
// (ResponsesRequest, with the stored history of previous_response_id),
// submits it, and answers from the manager's callbacks through a
// ResponsesStream: SSE events (`event: TYPE` + `data: JSON`) or the whole
// Response object. Like the chat route, no thread waits on a generation: the
// callbacks queue updates and a transport thread turns them into bytes; a
// client that goes away cancels the request; a deadline the workers miss ends
// a whole response with 504. A finished response with `store` (the default)
// is kept in the ResponseStore for follow-ups.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "coordinator/cluster_manager.h"
#include "coordinator/harmony/openai.h"
#include "coordinator/http_transport.h"
#include "coordinator/response_store.h"
#include "coordinator/tokenizer/tokenizer.h"

namespace flotilla::coordinator {

// What the driver needs of the HTTP server; everything must outlive the requests.
struct ResponsesHttpContext {
  ClusterManager* manager = nullptr;
  const tokenizer::Tokenizer* tokenizer = nullptr;
  ResponseStore* store = nullptr;
  std::string model_id;                         // the name replies carry
  std::vector<std::string> served_model_names;  // the names `model` may use
  harmony::OpenAiRequestOptions harmony;
  size_t max_prompt_text_bytes = 0;
  // The server's bookkeeping of requests in flight (cancelled by its Stop).
  std::function<void(uint64_t)> track, untrack;
  std::atomic<int64_t>* in_flight = nullptr;
};

// Serves one request whose deadline (from the request's headers) is `deadline`.
void ServeResponses(const ResponsesHttpContext& context, std::shared_ptr<HttpExchange> exchange,
                    std::optional<absl::Time> deadline);

}  // namespace flotilla::coordinator
