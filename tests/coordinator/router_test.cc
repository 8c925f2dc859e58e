// The router's choice among serving instances: cached prefixes against load,
// a conversation kept on its instance, and the two policies to compare with.
#include "coordinator/cluster/router.h"

#include <gtest/gtest.h>

namespace flotilla::coordinator {
namespace {

RouteCandidate Candidate(int instance, int requests, uint64_t cached, uint32_t queued = 0) {
  RouteCandidate c;
  c.instance = instance;
  c.load.serving = true;
  c.load.requests = requests;
  c.load.queued_sequences = queued;
  c.cached_tokens = cached;
  return c;
}

TEST(Router, CacheAwarePrefersTheCachedPrefixOverALittleMoreLoad) {
  Router r(RouterPolicy::kCacheAware);
  // 2,000 of 2,100 tokens cached on instance 1, which runs 3 more requests.
  EXPECT_EQ(r.Choose({Candidate(0, 1, 0), Candidate(1, 4, 2000)}, 2100, ""), 1);
  // A real queue there (sequences waiting for room) outweighs the hit.
  EXPECT_EQ(r.Choose({Candidate(0, 1, 0), Candidate(1, 4, 2000, 10)}, 2100, ""), 0);
  // Nothing cached anywhere: the less loaded one.
  EXPECT_EQ(r.Choose({Candidate(0, 3, 0), Candidate(1, 1, 0)}, 100, ""), 1);
}

TEST(Router, AConversationStaysOnItsInstanceWhileThatCostsLittle) {
  Router r(RouterPolicy::kCacheAware);
  r.Remember("session-a", 0);
  EXPECT_EQ(r.Choose({Candidate(0, 3, 0), Candidate(1, 1, 0)}, 100, "session-a"), 0);
  // Far busier: it moves, and is remembered where it went.
  EXPECT_EQ(r.Choose({Candidate(0, 3, 0, 5), Candidate(1, 1, 0)}, 100, "session-a"), 1);
  r.Remember("session-a", 1);
  EXPECT_EQ(r.Choose({Candidate(0, 1, 0), Candidate(1, 2, 0)}, 100, "session-a"), 1);
}

TEST(Router, LeastLoadedAndRoundRobinIgnoreTheCache) {
  Router least(RouterPolicy::kLeastLoaded);
  EXPECT_EQ(least.Choose({Candidate(0, 1, 0), Candidate(1, 4, 2000)}, 2100, ""), 0);
  Router turn(RouterPolicy::kRoundRobin);
  const std::vector<RouteCandidate> c = {Candidate(0, 0, 0), Candidate(1, 9, 0)};
  EXPECT_EQ(turn.Choose(c, 10, ""), 0);
  EXPECT_EQ(turn.Choose(c, 10, ""), 1);
  EXPECT_EQ(turn.Choose(c, 10, ""), 0);
  EXPECT_EQ(least.Choose({}, 10, ""), -1);
}

TEST(Router, PolicyNamesParseBack) {
  for (RouterPolicy p :
       {RouterPolicy::kCacheAware, RouterPolicy::kLeastLoaded, RouterPolicy::kRoundRobin}) {
    EXPECT_EQ(ParseRouterPolicy(RouterPolicyName(p)), p);
  }
  EXPECT_FALSE(ParseRouterPolicy("random").has_value());
}

}  // namespace
}  // namespace flotilla::coordinator
