// A host-memory tier under an engine's prefix cache: copies of cached KV
// blocks the device pool evicted, so a later prompt with the same prefix
// copies them back instead of computing them again.
//
// Entries are (token block, group): the token block's chained key
// (common/prefix_hash.h), its parent's key and its tokens (all three must
// match, so a hash collision is a miss), and one layer group's block data.
// The memory is a fixed arena of equal slots (the largest group's block),
// given by the engine (pinned on a GPU, so copies run asynchronously), so
// the tier never holds more than its capacity; when full, the least
// recently stored or used entry goes.
// Device-independent and not thread-safe: one engine drives it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <unordered_map>
#include <vector>

#include "absl/types/span.h"

namespace flotilla {

// Counters since the tier was made (and its use now).
struct KvHostTierStats {
  int64_t capacity_bytes = 0;  // the arena (0: no tier)
  int64_t used_bytes = 0;      // slots holding a block now
  int64_t stored_blocks = 0;   // blocks copied to the host (device evictions)
  int64_t hit_blocks = 0;      // blocks copied back to the device for a prefix hit
  int64_t bytes_to_host = 0;
  int64_t bytes_to_device = 0;
  int64_t evicted_blocks = 0;  // entries dropped to make room
};

class KvHostTier {
 public:
  // `arena`: `slots` slots of `slot_bytes` each (owned by the caller, who
  // keeps it alive while the tier lives).
  KvHostTier(uint8_t* arena, size_t slot_bytes, int64_t slots);

  // The slot to copy the block of (key, group) into, evicting the least
  // recently used entry when the tier is full; nullptr when (key, group) is
  // already held (then it only becomes the most recent) or `bytes` does not
  // fit a slot. The caller copies `bytes` into it at once.
  uint8_t* Store(uint64_t key, int group, uint64_t parent_key, absl::Span<const int32_t> tokens,
                 size_t bytes);
  // Whether (key, group) is held for exactly that parent and tokens.
  bool Contains(uint64_t key, int group, uint64_t parent_key,
                absl::Span<const int32_t> tokens) const;
  // Its data (bytes_of(key, group) bytes), marked most recently used and
  // counted as a hit; nullptr when not held.
  const uint8_t* Load(uint64_t key, int group, uint64_t parent_key,
                      absl::Span<const int32_t> tokens);

  // While frozen, Store keeps nothing (a restore is reading entries that
  // evictions must not overwrite).
  void Freeze(bool frozen) { frozen_ = frozen; }

  const KvHostTierStats& stats() const { return stats_; }
  int64_t slots() const { return capacity_slots_; }

 private:
  struct Entry {
    uint64_t key = 0;
    int group = 0;
    uint64_t parent_key = 0;
    std::vector<int32_t> tokens;
    size_t bytes = 0;
    int64_t slot = 0;
  };
  using Lru = std::list<Entry>;  // least recently used first
  static uint64_t IdOf(uint64_t key, int group) { return key * 131 + static_cast<uint64_t>(group); }
  Lru::iterator Find(uint64_t key, int group, uint64_t parent_key,
                     absl::Span<const int32_t> tokens) const;

  uint8_t* arena_;
  size_t slot_bytes_;
  int64_t capacity_slots_;
  std::vector<int64_t> free_slots_;
  mutable Lru lru_;
  std::unordered_multimap<uint64_t, Lru::iterator> index_;
  KvHostTierStats stats_;
  bool frozen_ = false;
};

}  // namespace flotilla
