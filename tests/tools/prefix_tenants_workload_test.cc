// `flotilla bench serve --workload prefix-tenants`'s prompts: system prompts
// shared by tenants' conversations, histories resent whole, seeded.
#include "tools/cli/prefix_tenants_workload.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <vector>

namespace flotilla::cli {
namespace {

PrefixTenantsOptions SmallOptions() {
  return {.tenants = 3,
          .system_tokens = 40,
          .user_min = 4,
          .user_max = 8,
          .max_turns = 3,
          .follow_up = 1.0,
          .vocab = 1000,
          .seed = 1};
}

bool StartsWith(const std::vector<int32_t>& v, const std::vector<int32_t>& prefix) {
  return v.size() >= prefix.size() && std::equal(prefix.begin(), prefix.end(), v.begin());
}

TEST(PrefixTenantsWorkload, ASeedGivesTheSameDistinctSystemPrompts) {
  PrefixTenants a(SmallOptions()), b(SmallOptions());
  std::set<std::vector<int32_t>> distinct;
  for (int t = 0; t < 3; ++t) {
    EXPECT_EQ(a.system_prompt(t), b.system_prompt(t));
    EXPECT_EQ(a.system_prompt(t).size(), 40u);
    distinct.insert(a.system_prompt(t));
  }
  EXPECT_EQ(distinct.size(), 3u);
  PrefixTenantsOptions other = SmallOptions();
  other.seed = 2;
  EXPECT_NE(PrefixTenants(other).system_prompt(0), a.system_prompt(0));
}

TEST(PrefixTenantsWorkload, ConversationsResendTheirWholeHistory) {
  PrefixTenants tenants(SmallOptions());
  TenantConversation conversation(tenants);
  std::mt19937_64 rng(3);
  std::vector<int32_t> history = conversation.Next(rng);
  ASSERT_EQ(conversation.turn(), 1);
  const std::vector<int32_t>& system = tenants.system_prompt(conversation.tenant());
  EXPECT_TRUE(StartsWith(history, system));
  EXPECT_EQ(conversation.shared_tokens(), 40);
  EXPECT_GE(history.size(), 44u);
  EXPECT_LE(history.size(), 48u);
  for (int turn = 2; turn <= 3; ++turn) {
    const std::vector<int32_t> output = {7, 8, 9};
    conversation.Done(output, /*ok=*/true);
    history.insert(history.end(), output.begin(), output.end());
    const std::vector<int32_t>& prompt = conversation.Next(rng);
    EXPECT_EQ(conversation.turn(), turn);
    EXPECT_EQ(conversation.shared_tokens(), static_cast<int64_t>(history.size()));
    EXPECT_TRUE(StartsWith(prompt, history));
    history = prompt;
  }
  // Past max_turns, and after a failed request, a new conversation starts.
  conversation.Done({1}, true);
  conversation.Next(rng);
  EXPECT_EQ(conversation.turn(), 1);
  EXPECT_TRUE(StartsWith(conversation.Next(rng), tenants.system_prompt(conversation.tenant())));
  conversation.Done({1}, false);
  conversation.Next(rng);
  EXPECT_EQ(conversation.turn(), 1);
}

TEST(PrefixTenantsWorkload, WithoutFollowUpsEveryRequestIsAFirstTurn) {
  PrefixTenantsOptions o = SmallOptions();
  o.follow_up = 0;
  PrefixTenants tenants(o);
  TenantConversation conversation(tenants);
  std::mt19937_64 rng(5);
  std::set<int> seen;
  for (int i = 0; i < 30; ++i) {
    conversation.Next(rng);
    EXPECT_EQ(conversation.turn(), 1);
    seen.insert(conversation.tenant());
    conversation.Done({1, 2}, true);
  }
  EXPECT_EQ(seen.size(), 3u);  // every tenant drawn
}

}  // namespace
}  // namespace flotilla::cli
