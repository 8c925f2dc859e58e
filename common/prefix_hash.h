// The keys that name cached KV blocks, shared by the worker's prefix cache
// (worker/engine/prefix_cache.h), which files blocks under them, and the
// coordinator's prefix index (coordinator/cluster/prefix_index.h), which
// computes them from a rendered prompt to ask which instance holds it.
//
// A block of block_size token ids is keyed by a chain: the key of the block
// before it and its own ids; the first block's "parent" is the root of the
// request's cache domain (SubmitSequence.cache_domain; 0 = the shared one).
// So a key names a whole prefix, not one block's tokens, and the same
// prefix in two domains has two unrelated chains.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/types/span.h"

namespace flotilla {

// splitmix64's finalizer: every input bit reaches every output bit.
inline uint64_t PrefixHashMix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// The parent key of a chain's first block in cache domain `domain`.
inline uint64_t PrefixRootKey(uint64_t domain) { return domain; }

// The key of the token block `tokens` after the block keyed `parent` (or a
// root). Never 0, which the prefix cache keeps for "no entry".
inline uint64_t PrefixBlockKey(uint64_t parent, absl::Span<const int32_t> tokens) {
  uint64_t key = PrefixHashMix(parent ^ 0x6a09e667f3bcc908ULL);
  for (int32_t token : tokens) key = PrefixHashMix(key ^ static_cast<uint32_t>(token));
  return key == 0 ? 1 : key;
}

// The keys of the whole blocks at the start of `tokens` in cache domain
// `domain`, at most `max_blocks` of them.
inline std::vector<uint64_t> PrefixBlockKeys(uint64_t domain, absl::Span<const int32_t> tokens,
                                             int64_t block_size, int64_t max_blocks) {
  std::vector<uint64_t> keys;
  if (block_size <= 0) return keys;
  const int64_t blocks =
      std::min<int64_t>(max_blocks, static_cast<int64_t>(tokens.size()) / block_size);
  if (blocks <= 0) return keys;
  keys.reserve(blocks);
  uint64_t parent = PrefixRootKey(domain);
  for (int64_t b = 0; b < blocks; ++b) {
    parent = PrefixBlockKey(parent, tokens.subspan(b * block_size, block_size));
    keys.push_back(parent);
  }
  return keys;
}

}  // namespace flotilla
