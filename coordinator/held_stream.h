// A streamed HTTP answer whose head may not have gone out yet (the chat
// completions' first chunks, the Responses API's head): what it produces
// before is held, then written in order behind the head. And the sink both
// HTTP generation APIs give their RequestSession.
#pragma once

#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "coordinator/access_log.h"
#include "coordinator/request_events.h"

namespace flotilla::coordinator {

// Writes `text` to the stream of `s` now, or holds it until the head went
// out. `Stream` has `begun` (the head went out), `held` (what waits for it)
// and `exchange` (the HttpExchange); its lock is held by the caller.
template <typename Stream>
void EmitLocked(Stream& s, std::string text) {
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
// `end(g, status)`. `Answer` has `mu` (taken here), `ended`, `access`,
// `builder` and `stream`, beside what EmitLocked reads.
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
