// What the two HTTP generation APIs (chat/completions and the Responses API)
// share about one answer: its error answer, its exchange, access record and ignored-fields
// header; a stream whose head may not have gone out yet (the chat completions'
// first chunks, the Responses API's head), whose earlier output is held, then
// written in order behind the head; and the sink both give their
// RequestSession.
#pragma once

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "coordinator/access_log.h"
#include "coordinator/http/http_transport.h"
#include "coordinator/http/openai_pipeline.h"
#include "coordinator/http/request_fields.h"
#include "coordinator/request_events.h"
#include "spdlog/spdlog.h"

namespace flotilla::coordinator {

// The whole answer for the API error `e`: its HTTP status and JSON body
// (ErrorJson).
inline HttpResponse ErrorResponse(const ApiError& e) {
  HttpResponse res;
  res.status = e.http_status;
  res.set_content(DumpJson(ErrorJson(e)), "application/json");
  return res;
}

// One HTTP answer, whole or streamed. The API's answer type adds its builder
// and state; everything below `mu` is guarded by it, and the exchange's calls
// are made under it so they reach the connection in order.
struct HttpAnswer {
  std::mutex mu;
  std::shared_ptr<HttpExchange> exchange;
  std::shared_ptr<AccessRecord> access;
  bool stream = false;
  bool begun = false;  // streams: the head went out
  std::string held;    // streams: text produced before `begun`
  bool ended = false;  // the whole answer was produced (or cancelled)
  // The x-flotilla-ignored-fields value (empty: none) every answer carries.
  std::string ignored_fields;

  // Takes the request of `to`: its access record (a fresh one when the
  // transport made none) and the header value naming `ignored`, logged once
  // here without the request's id (ids stay out of logs unless asked for).
  void Open(std::shared_ptr<HttpExchange> to, const std::vector<std::string>& ignored) {
    exchange = std::move(to);
    const HttpRequest& req = exchange->request();
    access = req.access ? req.access : std::make_shared<AccessRecord>(req.path, req.received);
    ignored_fields = IgnoredFieldsHeaderValue(ignored);
    if (!ignored_fields.empty()) {
      spdlog::warn("{}: ignored request fields this server does not know: {}", req.path,
                   ignored_fields);
    }
  }

  // Names the request's ignored fields on `res`, an answer to it.
  void TagIgnored(HttpResponse& res) const {
    if (!ignored_fields.empty()) res.set_header(kIgnoredFieldsHeader, ignored_fields);
  }
};

// Writes `text` to the stream of `s` now, or holds it until the head went
// out. The caller holds `s.mu`.
inline void EmitLocked(HttpAnswer& s, std::string text) {
  if (text.empty()) return;
  if (!s.begun) {
    s.held += text;
    return;
  }
  s.exchange->Write(std::move(text));
}

// A batch of the session's events on answer `g` (whole or streamed): the
// access log hears of them, `g.builder` turns them into JSON, a stream writes
// that as `spell` writes it, and the request's end ends the answer through
// `end(g, status)`.
template <typename Answer, typename Spell, typename End>
void ConsumeEvents(Answer& g, const std::vector<RequestEvent>& events, Spell spell, End end) {
  std::lock_guard<std::mutex> l(g.mu);
  if (g.ended) return;
  RecordEvents(*g.access, events);
  auto out = g.builder->Consume(events);
  if (g.stream) EmitLocked(g, spell(out));
  if (std::optional<absl::Status> status = RequestEnd(events)) end(g, *status);
}

}  // namespace flotilla::coordinator
