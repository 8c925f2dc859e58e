#include "coordinator/cluster/router.h"

#include <algorithm>
#include <limits>

#include "common/enum_names.h"

namespace flotilla::coordinator {
namespace {

constexpr EnumName<RouterPolicy> kRouterPolicies[] = {{RouterPolicy::kCacheAware, "cache-aware"},
                                                      {RouterPolicy::kLeastLoaded, "least-loaded"},
                                                      {RouterPolicy::kRoundRobin, "round-robin"}};

}  // namespace

std::string RouterPolicyName(RouterPolicy policy) {
  const char* name = NameIn(kRouterPolicies, policy);
  return name != nullptr ? name : "cache-aware";
}

std::optional<RouterPolicy> ParseRouterPolicy(std::string_view name) {
  return ValueIn(kRouterPolicies, name);
}

uint64_t Router::Cost(const RouteCandidate& c, uint64_t prompt_tokens, int least_requests) {
  const uint64_t cached = std::min(c.cached_tokens, prompt_tokens);
  const uint64_t running = static_cast<uint64_t>(std::max(0, c.load.requests - least_requests));
  uint64_t cost = (prompt_tokens - cached) + running * kTokensPerRunningRequest +
                  uint64_t{c.load.queued_sequences} * kTokensPerQueuedRequest;
  // An instance with no free KV block would only queue the request.
  if (c.load.kv_blocks_total > 0 && c.load.kv_blocks_free == 0) cost += 4 * kTokensPerQueuedRequest;
  return cost;
}

int Router::Choose(const std::vector<RouteCandidate>& candidates, uint64_t prompt_tokens,
                   const std::string& route_key) {
  if (candidates.empty()) return -1;
  std::lock_guard<std::mutex> lock(mu_);
  if (policy_ == RouterPolicy::kRoundRobin) {
    return static_cast<int>(next_++ % candidates.size());
  }
  int least = std::numeric_limits<int>::max();
  for (const RouteCandidate& c : candidates) least = std::min(least, c.load.requests);
  int best = 0;
  for (int i = 1; i < static_cast<int>(candidates.size()); ++i) {
    const RouteCandidate& a = candidates[i];
    const RouteCandidate& b = candidates[best];
    if (policy_ == RouterPolicy::kLeastLoaded) {
      if (a.load.requests + static_cast<int>(a.load.queued_sequences) <
          b.load.requests + static_cast<int>(b.load.queued_sequences)) {
        best = i;
      }
      continue;
    }
    const uint64_t ca = Cost(a, prompt_tokens, least), cb = Cost(b, prompt_tokens, least);
    if (ca < cb || (ca == cb && a.load.requests < b.load.requests)) best = i;
  }
  if (policy_ == RouterPolicy::kCacheAware && !route_key.empty()) {
    auto it = affinity_.find(route_key);
    if (it != affinity_.end()) {
      for (int i = 0; i < static_cast<int>(candidates.size()); ++i) {
        if (candidates[i].instance != it->second->second) continue;
        // Stay while it costs no more than the best by one queued request.
        if (Cost(candidates[i], prompt_tokens, least) <=
            Cost(candidates[best], prompt_tokens, least) + kTokensPerQueuedRequest) {
          best = i;
        }
      }
    }
  }
  return best;
}

void Router::Remember(const std::string& route_key, int instance) {
  if (route_key.empty() || policy_ != RouterPolicy::kCacheAware) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = affinity_.find(route_key);
  if (it != affinity_.end()) {
    it->second->second = instance;
    lru_.splice(lru_.begin(), lru_, it->second);
    return;
  }
  lru_.emplace_front(route_key, instance);
  affinity_[route_key] = lru_.begin();
  if (lru_.size() > kAffinityEntries) {
    affinity_.erase(lru_.back().first);
    lru_.pop_back();
  }
}

}  // namespace flotilla::coordinator
