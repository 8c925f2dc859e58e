// The router's choice among serving instances: cached prefixes against load,
// a conversation or tenant kept on its instance, new ones placed by the
// working sets against the KV, and the two policies to compare with.
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
  EXPECT_EQ(r.Choose({Candidate(0, 1, 0), Candidate(1, 12, 2000, 10)}, 2100, ""), 0);
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

TEST(Router, AQueueReportCountsAtMostTheRequestsInFlightThere) {
  Router r(RouterPolicy::kCacheAware);
  // A heartbeat-old report of 3 queued sequences on an instance the
  // coordinator has no request on: nothing waits there.
  EXPECT_EQ(r.Choose({Candidate(0, 1, 0), Candidate(1, 0, 0, 3)}, 100, ""), 1);
  EXPECT_EQ(Router::Cost(Candidate(1, 2, 0, 3), 100, 0), 100 + 2 * 16 + 2 * 256u);
}

RouteCandidate WithKv(RouteCandidate c, uint64_t kv_blocks) {
  c.load.kv_blocks_total = kv_blocks;
  c.load.kv_blocks_free = kv_blocks;
  return c;
}

TEST(Router, NewKeysGoWhereTheirWorkingSetsWeighLeastAgainstTheKv) {
  Router r(RouterPolicy::kCacheAware);
  // Cached nowhere, a little more load on instance 1: the keys alternate all
  // the same, each placement counting on its instance.
  std::vector<int> placed;
  for (int k = 0; k < 6; ++k) {
    const std::string key = "tenant-" + std::to_string(k);
    const int pick =
        r.Choose({WithKv(Candidate(0, 0, 0), 200), WithKv(Candidate(1, 1, 0), 200)}, 270, key);
    r.Remember(key, pick, 270);
    placed.push_back(pick);
  }
  EXPECT_EQ(placed, (std::vector<int>{0, 1, 0, 1, 0, 1}));
  EXPECT_EQ(r.WorkingSetTokens(), (std::map<int, uint64_t>{{0, 810}, {1, 810}}));
  // Twice the KV takes twice the keys.
  Router big(RouterPolicy::kCacheAware);
  int on_big = 0;
  for (int k = 0; k < 9; ++k) {
    const std::string key = "tenant-" + std::to_string(k);
    const int pick =
        big.Choose({WithKv(Candidate(0, 0, 0), 400), WithKv(Candidate(1, 0, 0), 200)}, 270, key);
    big.Remember(key, pick, 270);
    on_big += pick == 0 ? 1 : 0;
  }
  EXPECT_EQ(on_big, 6);
  // A cached prefix still wins over the balance, and a queue there still
  // sends the key elsewhere.
  EXPECT_EQ(r.Choose({WithKv(Candidate(0, 0, 0), 200), WithKv(Candidate(1, 0, 2000), 200)}, 2100,
                     "tenant-new"),
            1);
  EXPECT_EQ(r.Choose({WithKv(Candidate(0, 0, 0), 200), WithKv(Candidate(1, 0, 0), 200)}, 2100,
                     "tenant-new"),
            0);
  EXPECT_EQ(r.Choose({WithKv(Candidate(0, 2, 0, 2), 200), WithKv(Candidate(1, 0, 0), 200)}, 2100,
                     "tenant-new"),
            1);
}

TEST(Router, AKeyStaysWithItsCachedPrefixUntilTheQueueOutweighsComputingItTwice) {
  Router r(RouterPolicy::kCacheAware);
  r.Remember("tenant", 0, 268);
  // 256 tokens cached at home: staying costs 288 more (2 queued, 2 running
  // beyond the other's), within one queued request and what the other would
  // compute and cache again (256 + 256).
  EXPECT_EQ(r.Choose({Candidate(0, 2, 256, 2), Candidate(1, 0, 0)}, 268, "tenant"), 0);
  // 3 queued: 560 more, it goes.
  EXPECT_EQ(r.Choose({Candidate(0, 3, 256, 3), Candidate(1, 0, 0)}, 268, "tenant"), 1);
  // Cached on both: the margin is one queued request, so one queued there
  // (and one running) sends it elsewhere, running ones alone do not.
  EXPECT_EQ(r.Choose({Candidate(0, 3, 256), Candidate(1, 0, 256)}, 268, "tenant"), 0);
  EXPECT_EQ(r.Choose({Candidate(0, 1, 256, 1), Candidate(1, 0, 256)}, 268, "tenant"), 1);
}

TEST(Router, AKeyLeavesTheHeavierWorkingSetMoreReadily) {
  Router r(RouterPolicy::kCacheAware);
  r.Remember("a", 0, 270);
  r.Remember("b", 0, 270);
  r.Remember("c", 1, 270);
  // Nothing cached (evicted), one request queued at home: "a" leaves the
  // instance of two keys (the other's working set with it is no heavier)...
  EXPECT_EQ(
      r.Choose({WithKv(Candidate(0, 2, 0, 1), 200), WithKv(Candidate(1, 0, 0), 200)}, 270, "a"), 1);
  // ... "c" stays on the instance of one: moving would make the other's the
  // heavier, so the whole prompt counts against it.
  EXPECT_EQ(
      r.Choose({WithKv(Candidate(0, 0, 0), 200), WithKv(Candidate(1, 2, 0, 1), 200)}, 270, "c"), 1);
}

TEST(Router, AWorkingSetCountsForTheLastPlacementsOnly) {
  Router r(RouterPolicy::kCacheAware);
  r.Remember("old", 0, 1000);
  r.Remember("new", 1, 10);
  EXPECT_EQ(r.WorkingSetTokens(), (std::map<int, uint64_t>{{0, 1000}, {1, 10}}));
  // Placed again, a key counts once, with its last prompt, where it went.
  r.Remember("new", 0, 20);
  EXPECT_EQ(r.WorkingSetTokens(), (std::map<int, uint64_t>{{0, 1020}}));
  for (uint64_t i = 0; i + 1 < Router::kWorkingSetPlacements; ++i) r.Remember("new", 1, 30);
  EXPECT_EQ(r.WorkingSetTokens(), (std::map<int, uint64_t>{{1, 30}}));
  // Other policies keep nothing.
  Router least(RouterPolicy::kLeastLoaded);
  least.Remember("old", 0, 1000);
  EXPECT_TRUE(least.WorkingSetTokens().empty());
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
