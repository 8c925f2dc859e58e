// Router: which serving instance takes a request. Cache-aware routing weighs
// the prompt tokens an instance would not have to compute (its cached
// prefix, from the prefix index the workers' KV events feed) against the
// work queued there; least-loaded and round-robin exist to measure it.
#pragma once

#include <cstdint>
#include <list>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "coordinator/cluster/instance.h"
#include "coordinator/cluster/router_policy.h"

namespace flotilla::coordinator {

struct RouteCandidate {
  int instance = 0;
  InstanceLoad load;
  uint64_t cached_tokens = 0;  // leading prompt tokens it holds in its prefix cache
};

class Router {
 public:
  // The exchange rate between cache hits and load, in prompt tokens: a
  // sequence waiting on a worker for room delays a new one by about a
  // request's prefill; one running beside it (continuous batching) only
  // slows its steps a little.
  static constexpr uint64_t kTokensPerQueuedRequest = 256;
  static constexpr uint64_t kTokensPerRunningRequest = 16;
  // Conversations remembered for affinity (oldest forgotten first).
  static constexpr size_t kAffinityEntries = 65536;

  explicit Router(RouterPolicy policy) : policy_(policy) {}
  RouterPolicy policy() const { return policy_; }

  // The index into `candidates` (every one serving) to send a request of
  // `prompt_tokens` to; `route_key` (may be empty) keeps a conversation on
  // the instance that served it while that costs no more than going elsewhere.
  // -1 when there is no candidate.
  int Choose(const std::vector<RouteCandidate>& candidates, uint64_t prompt_tokens,
             const std::string& route_key);
  // Remembers that `route_key`'s conversation now lives on `instance`.
  void Remember(const std::string& route_key, int instance);

  // The cost in prompt-token units of sending the request to `c`.
  static uint64_t Cost(const RouteCandidate& c, uint64_t prompt_tokens, int least_requests);

 private:
  const RouterPolicy policy_;
  std::mutex mu_;
  uint64_t next_ = 0;  // round-robin
  std::list<std::pair<std::string, int>> lru_;
  std::unordered_map<std::string, std::list<std::pair<std::string, int>>::iterator> affinity_;
};

}  // namespace flotilla::coordinator
