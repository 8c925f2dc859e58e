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
//
// `background: true` answers at once with the response in progress (or the
// SSE stream, which the client may leave without cancelling it); the store
// holds it from then on, GET polls it until its status is completed,
// incomplete, failed or cancelled, and POST /v1/responses/{id}/cancel stops
// it. The request's deadline headers do not bound it. With include:
// ["reasoning.encrypted_content"] reasoning items carry their text sealed
// with the server's ReasoningCipher, which opens it again when a later
// request passes the item back in `input`.
#pragma once

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/harmony/openai.h"
#include "common/tokenizer/tokenizer.h"
#include "coordinator/cache_domain.h"
#include "coordinator/http/http_transport.h"
#include "coordinator/http/request_fields.h"
#include "coordinator/http/response_store.h"
#include "coordinator/http/responses_cipher.h"
#include "coordinator/request_session.h"

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
  // Seals reasoning for include: ["reasoning.encrypted_content"] and opens
  // it in input items (null: such requests and items are refused).
  const ReasoningCipher* cipher = nullptr;
  // Request fields this server does not know: ignored (named in the
  // x-flotilla-ignored-fields header and logged) or refused (request_fields.h).
  UnknownFields unknown_fields = UnknownFields::kIgnore;
};

// Serves one request of the key `owner` (its key id; empty without keys)
// whose deadline (from the request's headers) is `deadline`; its session runs
// on `hooks` (the exchange's threads and timers, the server's bookkeeping of
// its sequences). previous_response_id reaches only `owner`'s responses.
void ServeResponses(const ResponsesHttpContext& context, std::shared_ptr<HttpExchange> exchange,
                    const std::string& owner, std::optional<absl::Time> deadline,
                    SessionHooks hooks);

// GET /v1/responses/{id}: the stored response object (in progress while a
// background one runs), 404 unless `owner` created it; `target` is the
// request target, whose query may not ask for a resumed stream (400).
HttpResponse RetrieveResponse(const ResponsesHttpContext& context, const std::string& id,
                              const std::string& owner, const std::string& target);
// DELETE /v1/responses/{id}: forgets it (OpenAI's deletion object), after
// cancelling it if it runs in the background; 404 as retrieve's.
HttpResponse DeleteResponse(const ResponsesHttpContext& context, const std::string& id,
                            const std::string& owner);
// POST /v1/responses/{id}/cancel: stops a background response and answers
// it (status cancelled, or how it ended if it ended first; cancelling twice
// answers the same); 400 for a response not created with background: true
// or one that already completed, failed or was cut; 404 as retrieve's.
HttpResponse CancelResponse(const ResponsesHttpContext& context, const std::string& id,
                            const std::string& owner);

}  // namespace flotilla::coordinator
