// How the coordinator chooses an instance for a request.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace flotilla::coordinator {

enum class RouterPolicy {
  kCacheAware,   // the longest cached prefix, weighed against load
  kLeastLoaded,  // the fewest requests in flight
  kRoundRobin,   // in turn
};

// "cache-aware", "least-loaded", "round-robin".
std::string RouterPolicyName(RouterPolicy policy);
std::optional<RouterPolicy> ParseRouterPolicy(std::string_view name);

}  // namespace flotilla::coordinator
