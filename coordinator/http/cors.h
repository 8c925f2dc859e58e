// Cross-origin requests to the HTTP API (--allowed-origins): browsers may call
// the API from the listed origins only. Off by default (no origin listed: no
// CORS header is ever sent and preflights get the usual 404/405). "*" allows
// every origin. Preflights (OPTIONS with Access-Control-Request-Method) are
// answered before authentication, since browsers send them without the
// Authorization header they will send on the real request.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/http/http_transport.h"

namespace flotilla::coordinator {

class CorsPolicy {
 public:
  // `origins`: "*" or origins like "https://app.example.com" (scheme, host,
  // optional port; no path). INVALID_ARGUMENT naming a malformed one.
  static absl::StatusOr<CorsPolicy> Create(const std::vector<std::string>& origins);
  CorsPolicy() = default;  // off

  bool enabled() const { return any_ || !origins_.empty(); }
  // Whether a request from `origin` may be answered to the browser.
  bool Allows(const std::string& origin) const;
  // A preflight from an allowed origin: fills `res` (204 with the allowed
  // methods and headers) and returns true. False for anything else.
  bool AnswerPreflight(const HttpRequest& req, HttpResponse& res) const;
  // Adds Access-Control-Allow-Origin (and Vary: Origin) to the response of a
  // request from an allowed origin.
  void Decorate(const HttpRequest& req, HttpResponse& res) const;

 private:
  bool any_ = false;
  std::vector<std::string> origins_;
};

}  // namespace flotilla::coordinator
