#include "tools/cli/prefix_tenants_workload.h"

#include <algorithm>

namespace flotilla::cli {

PrefixTenants::PrefixTenants(const PrefixTenantsOptions& options) : options_(options) {
  options_.tenants = std::max(1, options_.tenants);
  options_.system_tokens = std::max(1, options_.system_tokens);
  options_.user_min = std::max(1, options_.user_min);
  options_.user_max = std::max(options_.user_min, options_.user_max);
  options_.max_turns = std::max(1, options_.max_turns);
  options_.follow_up = std::clamp(options_.follow_up, 0.0, 1.0);
  options_.vocab = std::max(1, options_.vocab);
  std::mt19937_64 rng(options_.seed * 0x9e3779b97f4a7c15ULL + 1);
  std::uniform_int_distribution<int32_t> token(0, options_.vocab - 1);
  system_.resize(options_.tenants);
  for (auto& prompt : system_) {
    prompt.resize(options_.system_tokens);
    for (int32_t& t : prompt) t = token(rng);
  }
}

const std::vector<int32_t>& TenantConversation::Next(std::mt19937_64& rng) {
  const PrefixTenantsOptions& o = tenants_.options();
  std::uniform_int_distribution<int32_t> token(0, o.vocab - 1);
  std::uniform_int_distribution<int> user(o.user_min, o.user_max);
  std::bernoulli_distribution follow_up(o.follow_up);
  if (continues_ && turn_ < o.max_turns && follow_up(rng)) {
    shared_ = static_cast<int64_t>(prompt_.size());
    ++turn_;
  } else {
    tenant_ = std::uniform_int_distribution<int>(0, o.tenants - 1)(rng);
    prompt_ = tenants_.system_prompt(tenant_);
    shared_ = static_cast<int64_t>(prompt_.size());
    turn_ = 1;
  }
  for (int n = user(rng); n > 0; --n) prompt_.push_back(token(rng));
  continues_ = false;  // until Done() says the request finished
  return prompt_;
}

}  // namespace flotilla::cli
