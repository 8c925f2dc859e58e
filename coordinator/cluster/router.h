// Router: which serving instance takes a request. Cache-aware routing weighs
// the prompt tokens an instance would not have to compute (its cached
// prefix, from the prefix index the workers' KV events feed) against the
// work queued there, keeps a conversation or tenant (a route key) on the
// instance it lives on, and places a route key it has not seen where the
// working sets of the keys already placed weigh least against the KV; so
// instances of little KV each hold a share of the keys instead of all of
// them evicting one another's. least-loaded and round-robin exist to
// measure it.
#pragma once

#include <cstdint>
#include <list>
#include <map>
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
  // Route keys remembered (oldest forgotten first).
  static constexpr size_t kAffinityEntries = 65536;
  // A route key's working set (its last prompt) counts on its instance
  // while the key was placed within this many placements of the newest.
  static constexpr uint64_t kWorkingSetPlacements = 1024;

  explicit Router(RouterPolicy policy) : policy_(policy) {}
  RouterPolicy policy() const { return policy_; }

  // The index into `candidates` (every one serving) to send a request of
  // `prompt_tokens` to; -1 when there is no candidate. Cache-aware: the
  // lowest Cost, except for a non-empty `route_key` (a conversation, or a
  // prompt's opening: cluster_manager.cc):
  //  - placed before on a candidate (its home), it stays there unless the
  //    home costs more than the cheapest by kTokensPerQueuedRequest plus the
  //    prompt tokens the home has cached beyond the cheapest's (which the
  //    cheapest would cache again, evicting other keys' prefixes there),
  //    plus the whole prompt when the cheapest's working set per KV block,
  //    with this prompt, would exceed the home's;
  //  - otherwise, among the candidates within kTokensPerQueuedRequest of the
  //    cheapest, the one whose working set (WorkingSetTokens, with this
  //    prompt) is the smallest per KV block (kv_blocks_total; per instance
  //    when one reports none); ties to the cheaper, then to the earlier.
  int Choose(const std::vector<RouteCandidate>& candidates, uint64_t prompt_tokens,
             const std::string& route_key);
  // Records that a request of `prompt_tokens` with `route_key` was placed
  // on `instance` (now the key's home). Cache-aware only.
  void Remember(const std::string& route_key, int instance, uint64_t prompt_tokens = 0);
  // Instance -> the summed last prompts of the route keys whose home it is,
  // of those placed within the last kWorkingSetPlacements placements.
  std::map<int, uint64_t> WorkingSetTokens();

  // The cost in prompt-token units of sending the request to `c`. Queued
  // sequences count at most the instance's requests in flight (a worker's
  // report may be a heartbeat old).
  static uint64_t Cost(const RouteCandidate& c, uint64_t prompt_tokens, int least_requests);

 private:
  struct Placed {
    std::string key;
    int instance = 0;
    uint64_t tokens = 0;  // its last prompt
    uint64_t serial = 0;  // placements_ when placed
  };
  std::map<int, uint64_t> WorkingSetTokensLocked() const;

  const RouterPolicy policy_;
  std::mutex mu_;
  uint64_t next_ = 0;        // round-robin
  uint64_t placements_ = 0;  // Remember calls
  std::list<Placed> lru_;    // most recently placed first
  std::unordered_map<std::string, std::list<Placed>::iterator> affinity_;
};

}  // namespace flotilla::coordinator
