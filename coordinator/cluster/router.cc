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
  const uint64_t queued = std::min<uint64_t>(c.load.queued_sequences,
                                             static_cast<uint64_t>(std::max(0, c.load.requests)));
  uint64_t cost = (prompt_tokens - cached) + running * kTokensPerRunningRequest +
                  queued * kTokensPerQueuedRequest;
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
  const int n = static_cast<int>(candidates.size());
  int best = 0;
  if (policy_ == RouterPolicy::kLeastLoaded) {
    for (int i = 1; i < n; ++i) {
      const RouteCandidate& a = candidates[i];
      const RouteCandidate& b = candidates[best];
      if (a.load.requests + static_cast<int>(a.load.queued_sequences) <
          b.load.requests + static_cast<int>(b.load.queued_sequences)) {
        best = i;
      }
    }
    return best;
  }
  int least = std::numeric_limits<int>::max();
  for (const RouteCandidate& c : candidates) least = std::min(least, c.load.requests);
  std::vector<uint64_t> cost(n);
  for (int i = 0; i < n; ++i) cost[i] = Cost(candidates[i], prompt_tokens, least);
  for (int i = 1; i < n; ++i) {
    if (cost[i] < cost[best] ||
        (cost[i] == cost[best] && candidates[i].load.requests < candidates[best].load.requests)) {
      best = i;
    }
  }
  if (route_key.empty()) return best;
  int home = -1;
  if (auto it = affinity_.find(route_key); it != affinity_.end()) {
    for (int i = 0; i < n; ++i) {
      if (candidates[i].instance == it->second->instance) home = i;
    }
  }
  if (home == best) return best;
  const std::map<int, uint64_t> working = WorkingSetTokensLocked();
  // Per KV block when every candidate reports its KV, else per instance.
  bool per_block = true;
  for (const RouteCandidate& c : candidates) per_block = per_block && c.load.kv_blocks_total > 0;
  // Candidate i's working set with `tokens` more, per KV block.
  auto share = [&](int i, uint64_t tokens) {
    auto w = working.find(candidates[i].instance);
    const double sum = static_cast<double>((w != working.end() ? w->second : 0) + tokens);
    return per_block ? sum / static_cast<double>(candidates[i].load.kv_blocks_total) : sum;
  };
  if (home >= 0) {
    // Going elsewhere computes there what the home has cached (in the
    // costs) and caches it there too, evicting about as many tokens of
    // other keys' prefixes under KV pressure: that counts again. So does
    // the whole prompt when the move leaves the other instance's working
    // set heavier than the home's.
    const uint64_t home_cached = std::min(candidates[home].cached_tokens, prompt_tokens);
    const uint64_t best_cached = std::min(candidates[best].cached_tokens, prompt_tokens);
    uint64_t margin =
        kTokensPerQueuedRequest + (home_cached > best_cached ? home_cached - best_cached : 0);
    if (share(best, prompt_tokens) > share(home, 0)) margin += prompt_tokens;
    return cost[home] <= cost[best] + margin ? home : best;
  }
  // A key without a home among the candidates: among those within one
  // queued request of the cheapest, where its working set weighs least.
  int pick = -1;
  double pick_share = 0;
  for (int i = 0; i < n; ++i) {
    if (cost[i] > cost[best] + kTokensPerQueuedRequest) continue;
    const double s = share(i, prompt_tokens);
    if (pick < 0 || s < pick_share || (s == pick_share && cost[i] < cost[pick])) {
      pick = i;
      pick_share = s;
    }
  }
  return pick;
}

std::map<int, uint64_t> Router::WorkingSetTokensLocked() const {
  std::map<int, uint64_t> tokens;
  for (const Placed& p : lru_) {
    if (placements_ - p.serial >= kWorkingSetPlacements) break;  // the rest are older
    tokens[p.instance] += p.tokens;
  }
  return tokens;
}

std::map<int, uint64_t> Router::WorkingSetTokens() {
  std::lock_guard<std::mutex> lock(mu_);
  return WorkingSetTokensLocked();
}

void Router::Remember(const std::string& route_key, int instance, uint64_t prompt_tokens) {
  if (route_key.empty() || policy_ != RouterPolicy::kCacheAware) return;
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t serial = ++placements_;
  auto it = affinity_.find(route_key);
  if (it != affinity_.end()) {
    *it->second = Placed{route_key, instance, prompt_tokens, serial};
    lru_.splice(lru_.begin(), lru_, it->second);
    return;
  }
  lru_.push_front(Placed{route_key, instance, prompt_tokens, serial});
  affinity_[route_key] = lru_.begin();
  if (lru_.size() > kAffinityEntries) {
    affinity_.erase(lru_.back().key);
    lru_.pop_back();
  }
}

}  // namespace flotilla::coordinator
