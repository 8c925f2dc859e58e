// A streamed HTTP answer whose head may not have gone out yet (the chat
// completions' first chunks, the Responses API's head): what it produces
// before is held, then written in order behind the head.
#pragma once

#include <string>
#include <utility>

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

}  // namespace flotilla::coordinator
