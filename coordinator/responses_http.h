// The HTTP driver of POST /v1/responses: parses and prepares the request
// (ResponsesRequest, with the stored history of previous_response_id),
// starts its RequestSession, and serializes the session's events through a
// ResponsesStream: SSE events (`event: TYPE` + `data: JSON`) or the whole
// Response object. As on the chat route, no thread waits on a generation:
// the session decodes on a transport thread (the hooks the server gives); a
// client that goes away cancels the request; a deadline the workers miss
// ends it (504, or an `error` event once streaming). A finished response
// with `store` (the default) is kept in the ResponseStore for follow-ups,
// for the caller's key only (GET and DELETE /v1/responses/{id} too).
#pragma once

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "coordinator/harmony/openai.h"
#include "coordinator/cache_domain.h"
#include "coordinator/http_transport.h"
#include "coordinator/request_session.h"
#include "coordinator/response_store.h"
#include "coordinator/tokenizer/tokenizer.h"

namespace flotilla::coordinator {

// What the driver needs of the HTTP server; everything must outlive the requests.
struct ResponsesHttpContext {
  RequestBackend* backend = nullptr;
  const tokenizer::Tokenizer* tokenizer = nullptr;
  ResponseStore* store = nullptr;
  std::string model_id;                         // the name replies carry
  std::vector<std::string> served_model_names;  // the names `model` may use
  harmony::OpenAiRequestOptions harmony;
  size_t max_prompt_text_bytes = 0;
  // HTTP generations in flight: counted up here, down by the hooks'
  // on_all_released (or here when the session does not start).
  std::atomic<int64_t>* in_flight = nullptr;
  CacheDomainPolicy cache_domains;  // which requests share cached prompt blocks
};

// Serves one request of the key `owner` (its key id; empty without keys)
// whose deadline (from the request's headers) is `deadline`; its session runs
// on `hooks` (the exchange's threads and timers, the server's bookkeeping of
// its sequences). previous_response_id reaches only `owner`'s responses.
void ServeResponses(const ResponsesHttpContext& context, std::shared_ptr<HttpExchange> exchange,
                    const std::string& owner, std::optional<absl::Time> deadline,
                    SessionHooks hooks);

// GET /v1/responses/{id}: the stored response object, 404 unless `owner` created it.
HttpResponse RetrieveResponse(const ResponsesHttpContext& context, const std::string& id,
                              const std::string& owner);
// DELETE /v1/responses/{id}: forgets it (OpenAI's deletion object), 404 as retrieve's.
HttpResponse DeleteResponse(const ResponsesHttpContext& context, const std::string& id,
                            const std::string& owner);

}  // namespace flotilla::coordinator
