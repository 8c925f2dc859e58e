// `flotilla bench serve --workload prefix-tenants`: a multi-tenant load whose
// prompts share long prefixes, the case a cache-aware router is for. Each of
// `tenants` tenants has its own system prompt of `system_tokens` token ids;
// a stream's request either starts a conversation of a random tenant (its
// system prompt and a short user turn) or, with probability `follow_up`,
// continues the stream's conversation: the whole history (every earlier
// prompt and output) plus a new user turn, up to `max_turns` turns. Everything
// is drawn from seeded generators, so a seed gives the same prompts.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "tools/cli/prompt_stream.h"

namespace flotilla::cli {

struct PrefixTenantsOptions {
  int tenants = 32;          // distinct system prompts
  int system_tokens = 2000;  // tokens of each
  int user_min = 16, user_max = 64;  // tokens of each user turn (uniform)
  int max_turns = 4;         // turns of one conversation at most
  double follow_up = 0.5;    // chance that a stream's next request continues its conversation
  int vocab = 1;             // token ids are drawn from [0, vocab)
  uint64_t seed = 1;         // the system prompts' seed
};

// The tenants' system prompts: made once, read by every stream.
class PrefixTenants {
 public:
  explicit PrefixTenants(const PrefixTenantsOptions& options);
  const PrefixTenantsOptions& options() const { return options_; }
  const std::vector<int32_t>& system_prompt(int tenant) const { return system_[tenant]; }

 private:
  PrefixTenantsOptions options_;
  std::vector<std::vector<int32_t>> system_;
};

// One stream's requests, one at a time: Next() gives the next prompt, Done()
// takes what it generated (a failed request ends its conversation).
class TenantConversation : public GrowingConversation {
 public:
  explicit TenantConversation(const PrefixTenants& tenants) : tenants_(tenants) {}

  // Of the prompt it returns: its turn in its conversation (1..max_turns),
  // its tenant, and as shared tokens those earlier requests sent too (the
  // system prompt on turn 1, the whole history after): what a perfect prefix
  // cache would not compute.
  const std::vector<int32_t>& Next(std::mt19937_64& rng) override;
  int tenant() const { return tenant_; }

 private:
  const PrefixTenants& tenants_;
  int tenant_ = -1;
};

}  // namespace flotilla::cli
