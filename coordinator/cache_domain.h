// Which requests share cached prompt blocks (SubmitSequence.cache_domain).
//
// A cache hit answers faster, so a shared prefix cache tells one tenant what
// another asked (send a guess, time the first token). Cached blocks are
// therefore shared only within a domain: by default one per API key; a
// request's `cache_salt` (vLLM's field) names a domain of its own, shared
// by every request with the same salt whatever its key; a server without
// keys, or started with --shared-prefix-cache, has one domain for requests
// without a salt.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace flotilla::coordinator {

struct CacheDomainPolicy {
  bool shared = false;  // --shared-prefix-cache: requests without a salt share one domain
};

// The domain of a request with `cache_salt` (empty: none) from the key
// `key_id` (empty: the server has no keys). 0 is the shared domain; any other
// value is 64 bits of SHA-256 of what names the domain, so no salt can be
// chosen to land in another key's domain.
uint64_t CacheDomain(const std::string& cache_salt, const std::string& key_id,
                     const CacheDomainPolicy& policy);

// INVALID_ARGUMENT naming cache_salt when it is longer than
// kMaxCacheSaltBytes (empty is "none" on the gRPC API).
absl::Status CheckCacheSalt(const std::string& cache_salt);

}  // namespace flotilla::coordinator
