// The one place a typed request (prepared_request.h) becomes the
// SessionRequest a RequestSession runs, for every front end: HTTP chat,
// completions and Responses, gRPC Chat and Generate.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/time/time.h"
#include "coordinator/prepared_request.h"
#include "coordinator/request_session.h"

namespace flotilla::coordinator {

// What the front end knows beyond the request itself.
struct SessionContext {
  // Seeds the tool call ids (chat): unique per request.
  std::string call_id_seed;
  std::optional<absl::Time> deadline;
  uint64_t cache_domain = 0;  // cache_domain.h
  // The route key when the request names none (HTTP: the x-session-id header).
  std::string default_route_key;
};

// Chat decodes Harmony, completions plain text; every prompt x `n` choices;
// sampling, constraint, stop strings, echo and prompt logits as prepared.
SessionRequest SessionRequestOf(const PreparedRequest& prepared, SessionContext context);

}  // namespace flotilla::coordinator
