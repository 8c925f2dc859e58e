// PrefixIndex: which KV blocks each instance's prefix caches hold, fed by the
// KvEvents its DP-group leaders send (proto/cluster.proto), so the router can
// ask how much of a rendered prompt an instance would not have to compute.
//
// A block is named by its chained key (common/prefix_hash.h), computed here
// from the prompt's token ids and the request's cache domain exactly as the
// worker files it. A match follows the worker's rule
// (KvBlockAllocator::MatchPrefix): the full-attention layers must hold every
// block up to its end, the sliding-window layers only the blocks of the
// window before it; it stops short of the prompt's last token, which is
// always computed. Each DP group of an instance has its own cache; an
// instance's figure is its best group's.
//
// What it may get wrong, always toward fewer cached tokens but for the
// last case: keys dropped by the entry bound (oldest stored first) read as
// missing; blocks stored since the sender's last report are not known yet;
// and a block whose parent was evicted and computed again while it stayed
// cached reads as held though the worker's chain no longer reaches it.
//
// Thread-safe: Apply (session threads) and the matches (request threads)
// may run at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <map>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "proto/cluster.pb.h"

namespace flotilla::coordinator {

class PrefixIndex {
 public:
  // About 100 bytes each: 2^20 block keys take about 100 MiB.
  static constexpr size_t kDefaultMaxEntries = size_t{1} << 20;

  explicit PrefixIndex(size_t max_entries = kDefaultMaxEntries);

  // Applies one report of a DP-group leader of instance `instance`
  // (WorkerMessage.kv_events). INVALID_ARGUMENT, changing nothing, for a
  // group kind that is unset or unknown or a block size of 0.
  absl::Status Apply(int instance, const cluster::KvEvents& events);
  // Drops everything `instance` reported (it failed, re-formed or left).
  void Forget(int instance);

  // Leading tokens of `prompt_ids` (whole blocks, fewer than all of them)
  // that instance `instance` holds cached for cache domain `cache_domain`
  // (SubmitSequence.cache_domain); 0 when it reported nothing.
  int64_t MatchedTokens(int instance, uint64_t cache_domain,
                        absl::Span<const int32_t> prompt_ids) const;
  // The same for every instance that reported, hashing the prompt once per
  // block size: instance -> matched tokens.
  std::map<int, int64_t> MatchedTokensByInstance(uint64_t cache_domain,
                                                 absl::Span<const int32_t> prompt_ids) const;

  // Block keys held now (all instances and groups), for tests and metrics.
  size_t entries() const;

 private:
  // One DP group of one instance.
  struct SourceId {
    int instance = 0;
    uint32_t dp_group = 0;
    bool operator<(const SourceId& o) const {
      return std::pair(instance, dp_group) < std::pair(o.instance, o.dp_group);
    }
  };
  using LruList = std::list<std::pair<SourceId, uint64_t>>;
  struct Entry {
    bool full = false;    // the full-attention layers hold it
    bool window = false;  // the sliding-window layers hold it
    LruList::iterator lru;
  };
  struct Source {
    int64_t block_size = 0;
    int64_t sliding_window = 0;
    std::unordered_map<uint64_t, Entry> blocks;
  };

  // Blocks of `keys` (the prompt's, in order) that `source` can serve.
  static int64_t MatchedBlocks(const Source& source, const std::vector<uint64_t>& keys);
  void DropSource(std::map<SourceId, Source>::iterator it);
  // Sets one kind's bit of `key` in `source`, adding or erasing its entry.
  void Mark(const SourceId& id, Source& source, uint64_t key, bool window, bool held);

  const size_t max_entries_;
  mutable std::mutex mu_;
  std::map<SourceId, Source> sources_;
  LruList lru_;  // every entry, least recently stored first
};

}  // namespace flotilla::coordinator
