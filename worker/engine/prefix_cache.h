// KV blocks of an engine's arena: a reference-counted allocator that also
// remembers which full token blocks the blocks hold (the prefix cache), so a
// new sequence whose prompt starts like an earlier one shares those blocks
// instead of computing them again.
//
// A token block (block_size tokens) is keyed by a chained hash: the key of
// the block before it and its own token ids (common/prefix_hash.h, which the
// coordinator computes too). The index compares the tokens and the parent
// entry too, so a hash collision is a miss, never a wrong hit.
// One token block may own several physical blocks ("slots": the CPU engine
// keeps one per layer; the CUDA engine one for every layer at once); a slot of
// -1 is not kept (a sliding-window layer may have dropped it).
//
// Blocks that no sequence holds are free. A free block that still holds a
// cached token block stays in an LRU and is reused (evicted) only when no
// other free block is left; holding it again (a hit) takes it out of the LRU.
// So free_blocks() counts cached blocks too: caching never starves admission.
//
// The blocks may form several pools (the CUDA engine: one per layer group,
// so a group's blocks can be sized for its own layers and KV dtype). Each
// slot belongs to one pool; a pool has its own block ids
// ([first_block, first_block + its size)), reference counts, free list and
// LRU, so one pool's evictions never take another's blocks. The calls below
// name a block with its pool (0 when there is one).
//
// TakeEvents reports which token blocks the slots of each kind (full
// attention, sliding window) hold in full (KvEventLog), for the
// coordinator's cache-aware router.
// Device-independent and not thread-safe: one engine drives it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "worker/engine/kv_event_log.h"

namespace flotilla {

struct PrefixCacheOptions {
  int64_t block_size = 16;  // tokens per block
  int32_t first_block = 0;  // the blocks managed are [first_block, first_block + num_blocks)
  int32_t num_blocks = 0;   // the blocks of pool 0 when pool_blocks is empty
  // Blocks per pool; empty = one pool of num_blocks.
  std::vector<int32_t> pool_blocks;
  int slots = 1;            // physical blocks per token block
  // Per slot: the pool its blocks come from; empty = pool 0 for every slot.
  std::vector<int> slot_pools;
  bool enabled = true;      // false: a plain reference-counted allocator
  // Per slot: whether it belongs to a sliding-window group (else full
  // attention); empty = every slot is full attention.
  std::vector<bool> window_slots;
  // Bound on the unsent changes of TakeEvents (then a resync).
  size_t max_pending_events = 65536;
  // Tests: the key of a token block after `parent` (to force collisions).
  std::function<uint64_t(uint64_t parent, absl::Span<const int32_t> tokens)> hash;
  // Called when Allocate evicts a free block that caches a token block
  // (before the block is handed out again): its slot, the block, the token
  // block's key, its parent's key and its tokens. The host tier keeps a copy.
  std::function<void(int slot, int32_t block, uint64_t key, uint64_t parent_key,
                     absl::Span<const int32_t> tokens)>
      on_evict;
};

class PrefixCache {
 public:
  // Where a chain of token blocks stands: the last registered entry.
  struct Link {
    uint64_t key = 0;
    // 0: the start of a chain of the shared domain; >= 2^63: the start of a
    // chain of another domain (Root); else the serial of a registered block.
    uint64_t serial = 0;
  };
  // One cached token block found by Walk.
  struct Hit {
    Link link;
    std::vector<int32_t> slots;
  };
  // A sequence's progress through the index: its registered blocks, the link
  // of the last one and the tokens of its block in progress. `broken` once a
  // block could not be registered (its successors never are).
  struct Chain {
    Link link;
    int64_t blocks = 0;
    std::vector<int32_t> partial;
    bool broken = false;
  };

  static absl::StatusOr<std::unique_ptr<PrefixCache>> Create(PrefixCacheOptions options);

  bool enabled() const { return options_.enabled; }
  int64_t block_size() const { return options_.block_size; }

  // ---- allocation ----
  int num_pools() const { return static_cast<int>(pools_.size()); }
  int32_t pool_size(int pool) const { return static_cast<int32_t>(pools_[pool].refcount.size()); }
  // The pool slot `slot`'s blocks come from.
  int pool_of_slot(int slot) const { return slot_pool_[slot]; }
  // Blocks no sequence holds (cached ones included: they are evictable),
  // every pool together / of one pool.
  int64_t free_blocks() const;
  int64_t free_blocks(int pool) const {
    return static_cast<int64_t>(pools_[pool].plain_free.size()) + pools_[pool].lru_size;
  }
  // Free blocks that still hold a cached token block (every pool together
  // / of one pool).
  int64_t cached_free_blocks() const;
  int64_t cached_free_blocks(int pool) const { return pools_[pool].lru_size; }
  // A block of `pool` with reference count 1: an uncached free block when
  // there is one, else the least recently freed cached block (the index
  // forgets it). nullopt when every block of the pool is held.
  std::optional<int32_t> Allocate(int pool = 0);
  // One more holder (a hit on a free cached block takes it out of the LRU).
  void Hold(int32_t block, int pool = 0);
  // One holder fewer; at zero the block is free (and kept cached if it is).
  void Release(int32_t block, int pool = 0);
  int32_t refcount(int32_t block, int pool = 0) const {
    return pools_[pool].refcount[block - options_.first_block];
  }
  bool cached(int32_t block, int pool = 0) const { return cached_key(block, pool) != 0; }
  // The key of the token block `block` caches (0: none).
  uint64_t cached_key(int32_t block, int pool = 0) const {
    return pools_[pool].entry_of[block - options_.first_block];
  }
  // A free block still caching the token block keyed `key` moves to the
  // recent end of its pool's LRU, as if released now; any other block is
  // left as it is (held, evicted, or caching another token block since).
  void Refresh(int32_t block, uint64_t key, int pool = 0);

  // ---- the index ----
  // Where the chains of cache domain `domain` start (0: the shared domain).
  // A chain's first block is keyed and compared by its root, so chains of
  // different domains never share a block: one tenant's prompts give
  // another no cache hit (and so no time-to-first-token oracle).
  static Link Root(uint64_t domain);
  // The cached token blocks at the start of `tokens`, at most `max_blocks`,
  // in the domain whose root is `root`, stopping at the first miss. Empty
  // when disabled.
  std::vector<Hit> Walk(absl::Span<const int32_t> tokens, int64_t max_blocks, Link root) const;
  // ... in the shared domain.
  std::vector<Hit> Walk(absl::Span<const int32_t> tokens, int64_t max_blocks) const {
    return Walk(tokens, max_blocks, Root(0));
  }
  // Appends `tokens` to `chain`; each token block this completes is
  // registered with the slots `slots_of(block_index, &slots)` fills (blocks
  // the caller holds, or -1). A block already cached keeps its entry (its
  // missing slots are filled in); a different block under the same key
  // breaks the chain unless no sequence holds it (then it is replaced).
  void Extend(Chain* chain, absl::Span<const int32_t> tokens,
              absl::FunctionRef<void(int64_t block, std::vector<int32_t>* slots)> slots_of);
  // The key of the token block `tokens` after the one keyed `parent` (a
  // chain starts at Root(domain).key).
  uint64_t BlockKey(uint64_t parent, absl::Span<const int32_t> tokens) const {
    return Key(parent, tokens);
  }
  // Token blocks in the index (for tests and stats).
  int64_t entries() const { return static_cast<int64_t>(entries_.size()); }

  // ---- events ----
  // What the index gained and lost since the last call, at most `max_keys`
  // keys: a block is held by the full-attention kind while its entry exists
  // and every full-attention slot is kept, by the sliding-window kind while
  // every sliding-window slot is (none is reported when no slot slides).
  // The first call is a resync (KvEventLog); recording starts with it.
  KvEventBatch TakeEvents(size_t max_keys);

 private:
  struct Entry {
    uint64_t serial = 0;
    uint64_t parent_serial = 0;
    std::vector<int32_t> tokens;
    std::vector<int32_t> slots;
    int live_slots = 0;
    int live_window_slots = 0;  // of those, sliding-window slots
    uint64_t parent_key = 0;
    // Entries registered after this one (their parent_serial is its serial;
    // kept until they go).
    std::vector<uint64_t> children;
    // Its parent entry went: Walk never reaches it again (a new parent has a
    // new serial), so it is reported held by no kind.
    bool unreachable = false;
  };
  // Which kinds hold an entry in full (see TakeEvents).
  struct Held {
    bool full = false;
    bool window = false;
  };

  explicit PrefixCache(PrefixCacheOptions options);
  uint64_t Key(uint64_t parent, absl::Span<const int32_t> tokens) const;
  // Registers one completed token block; the new link, or nullopt (broken).
  std::optional<Link> Insert(Link parent, absl::Span<const int32_t> tokens,
                             const std::vector<int32_t>& slots);
  void AddSlots(Entry& entry, uint64_t key, const std::vector<int32_t>& slots);
  Held HeldBy(const Entry* entry) const;
  // Records the change of an entry's Held from `before` to `after`.
  void Report(uint64_t key, Held before, Held after);
  // Drops an entry none of whose blocks is held; false when one is.
  bool DropIfUnheld(uint64_t key);
  // Erases an entry (its blocks already forgotten; `before`: which kinds
  // held it until then): its parent no longer lists it, and the entries
  // below it become unreachable.
  void Erase(std::unordered_map<uint64_t, Entry>::iterator it, Held before);
  // A new entry joins its parent's children, or is unreachable at once.
  void Attach(uint64_t key, Entry& entry);
  // One pool's blocks (index = block - first_block).
  struct Pool {
    std::vector<int32_t> refcount;
    std::vector<uint64_t> entry_of;  // key of the entry holding it; 0 = none
    std::vector<int32_t> slot_of;
    std::vector<int32_t> plain_free;  // free and uncached, a stack
    // Free and cached, least recently freed first: an intrusive list.
    std::vector<int32_t> lru_prev, lru_next;
    int32_t lru_head = -1, lru_tail = -1;
    int64_t lru_size = 0;
  };

  // The block of `pool` no longer holds a cached token block.
  void Forget(Pool& pool, int32_t index);
  static void LruPushBack(Pool& pool, int32_t index);
  static void LruRemove(Pool& pool, int32_t index);

  PrefixCacheOptions options_;
  std::vector<bool> window_slot_;  // per slot: sliding window
  int window_slot_count_ = 0;
  KvEventLog events_;
  uint64_t next_serial_ = 1;
  std::unordered_map<uint64_t, Entry> entries_;
  std::vector<int> slot_pool_;  // per slot
  std::vector<Pool> pools_;
};

}  // namespace flotilla
