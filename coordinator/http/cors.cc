#include "coordinator/http/cors.h"

#include <algorithm>
#include <regex>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace flotilla::coordinator {
namespace {

// What the API answers to browsers: its methods, and the request headers
// clients send (the OpenAI SDKs add their own x-stainless-* headers).
constexpr char kMethods[] = "GET, POST, DELETE, OPTIONS";
constexpr char kMaxAge[] = "600";

}  // namespace

absl::StatusOr<CorsPolicy> CorsPolicy::Create(const std::vector<std::string>& origins) {
  static const std::regex origin(R"(^https?://[A-Za-z0-9.\-]+(:[0-9]{1,5})?$|^https?://\[[0-9A-Fa-f:.]+\](:[0-9]{1,5})?$)");
  CorsPolicy policy;
  for (const std::string& o : origins) {
    if (o.empty()) continue;
    if (o == "*") {
      policy.any_ = true;
      continue;
    }
    if (!std::regex_match(o, origin)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--allowed-origins: '", o,
          "' is not an origin: give scheme://host[:port] (no path, e.g. https://app.example.com) "
          "or *"));
    }
    policy.origins_.push_back(absl::AsciiStrToLower(o));
  }
  return policy;
}

bool CorsPolicy::Allows(const std::string& origin) const {
  if (origin.empty()) return false;
  if (any_) return true;
  return std::find(origins_.begin(), origins_.end(), absl::AsciiStrToLower(origin)) !=
         origins_.end();
}

bool CorsPolicy::AnswerPreflight(const HttpRequest& req, HttpResponse& res) const {
  if (req.method != "OPTIONS" || !req.has_header("Access-Control-Request-Method")) return false;
  const std::string origin = req.get_header_value("Origin");
  if (!Allows(origin)) return false;
  res.status = 204;
  res.set_header("Access-Control-Allow-Origin", any_ ? "*" : origin);
  res.set_header("Access-Control-Allow-Methods", kMethods);
  // Whatever the browser asks to send (Authorization, Content-Type, the
  // SDKs' own headers): the API reads only what it knows.
  const std::string asked = req.get_header_value("Access-Control-Request-Headers");
  if (!asked.empty()) res.set_header("Access-Control-Allow-Headers", asked);
  res.set_header("Access-Control-Max-Age", kMaxAge);
  if (!any_) res.set_header("Vary", "Origin");
  return true;
}

void CorsPolicy::Decorate(const HttpRequest& req, HttpResponse& res) const {
  const std::string origin = req.get_header_value("Origin");
  if (!Allows(origin)) return;
  for (const auto& [name, value] : res.headers) {
    if (absl::EqualsIgnoreCase(name, "Access-Control-Allow-Origin")) return;  // a preflight's
  }
  res.set_header("Access-Control-Allow-Origin", any_ ? "*" : origin);
  if (!any_) res.set_header("Vary", "Origin");
}

}  // namespace flotilla::coordinator
