// The block bookkeeping of a paged KV cache, shared by the CPU engine's
// KvCache and the CUDA engine's device arena, so both admit, reserve and free
// by the same rules. Each sequence has one block table per layer group; a
// physical block holds block_size positions of every layer of one group. The
// CPU cache makes a group of each layer; the CUDA engine two groups (the
// full-attention layers and the sliding-window layers), one table each.
//
// Full-attention groups keep every position. Sliding-window groups keep only
// the last window - 1 positions (what the next query needs besides itself)
// and free the blocks that leave the window when a step commits. During a
// step a sliding group also holds the step's new positions: all of them when
// `write_whole_chunk` (the CUDA engine's kernels write every new key and
// attend to them from the cache), otherwise only those still in the window at
// the step's end (the CPU engine skips the rest).
//
// With prefix_cache on, every full token block a sequence completes is
// registered in a PrefixCache with its blocks of every group; a new sequence
// starts from the longest cached prefix whose full groups have every block
// and whose sliding groups have the window before its end. Blocks leaving the
// window are released but stay cached (and evictable); when the sequence is
// freed they go back to the recent end of the cache's LRU with its other
// blocks, last blocks first, as if it had held them to the end. So the
// window before the end of a cached prompt (released once decoding moved
// past it) is evicted no sooner than the prompt's full-group blocks, which
// are useless without it. Forks share blocks (reference counted); Reserve
// copies a shared block before it is written.
//
// Groups draw their blocks from pools (`group_pools`, `pool_blocks`): one
// pool for every group (the CPU cache), or a pool per group (the CUDA
// engine, so a full-attention block of FP8 KV takes about half the bytes of
// a bf16 sliding-window block). A pool has its own block ids, free list,
// LRU and prefix-cache slots; admission counts each pool against its own
// size (PoolBlocksForLength, admission_blocks).
//
// With write_whole_chunk a sliding group holds during a step its window
// and the step's new positions. A sequence's reservation counts only its
// window (and the blocks a chunk may straddle); the new positions of one
// step, at most max_chunk_tokens over all of its sequences, come from a
// step reserve each pool with a sliding group keeps out of admission.
// Not thread-safe: one owner (the engine) drives it.
#pragma once

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "worker/engine/kv_host_tier.h"
#include "worker/engine/prefix_cache.h"

namespace flotilla {

// Moves one group's block (all of the group's layers) between an engine's
// arena and host memory, for the host tier.
class KvBlockMover {
 public:
  virtual ~KvBlockMover() = default;
  virtual size_t BlockBytes(int group) const = 0;
  // Copies `block` of `group` to `host` (BlockBytes(group) bytes) before the
  // block is written again; on a device, ordered before the engine's later
  // work (host memory pinned, the copy asynchronous).
  virtual void ToHost(int group, int32_t block, uint8_t* host) = 0;
  virtual void ToDevice(int group, int32_t block, const uint8_t* host) = 0;
};

struct KvBlockAllocatorOptions {
  std::vector<bool> sliding;  // one per group: whether it keeps only the window
  int64_t window = 0;         // sliding window in tokens (keys a query sees, itself included)
  int64_t block_size = 16;    // positions per block
  int32_t first_block = 0;    // each pool's blocks: [first_block, first_block + its size)
  int64_t num_blocks = 0;     // blocks of the one pool when pool_blocks is empty
  // Per group: the pool its blocks come from; empty = pool 0 for every group.
  std::vector<int> group_pools;
  // Blocks per pool; empty = one pool of num_blocks.
  std::vector<int64_t> pool_blocks;
  bool prefix_cache = false;  // share full blocks of identical prefixes
  bool write_whole_chunk = false;  // sliding groups hold every new position of a step
  int64_t max_chunk_tokens = 0;    // with write_whole_chunk: most new tokens of one sequence per step
  // With prefix_cache: a host tier that keeps the cached blocks the pools
  // evict, and what copies them (neither owned; both or neither).
  KvHostTier* host_tier = nullptr;
  KvBlockMover* mover = nullptr;
};

class KvBlockAllocator {
 public:
  using SequenceId = int64_t;
  // Copies physical block `from` of `group` into `to` (all of the group's
  // layers), for copy on write.
  using CopyBlock = absl::FunctionRef<void(int group, int32_t from, int32_t to)>;

  static absl::StatusOr<std::unique_ptr<KvBlockAllocator>> Create(
      const KvBlockAllocatorOptions& options);

  SequenceId CreateSequence();
  // A new sequence with the same blocks as `source`, shared until written.
  absl::StatusOr<SequenceId> Fork(SequenceId source);
  // Releases the sequence's blocks (shared ones stay with their other holders).
  absl::Status Free(SequenceId seq);
  bool Contains(SequenceId seq) const { return seqs_.count(seq) != 0; }
  // OK for a sequence this allocator holds, else what an engine answers a
  // caller naming an unknown one (INVALID_ARGUMENT).
  absl::Status CheckKnown(SequenceId seq) const;
  absl::StatusOr<int64_t> Length(SequenceId seq) const;

  // Whole blocks at the start of `tokens` (at most max_blocks) a new sequence
  // of cache domain `domain` (PrefixCache::Root) can take from the cache
  // (the pools, or the host tier for blocks the pools evicted).
  int64_t MatchPrefix(absl::Span<const int32_t> tokens, int64_t max_blocks,
                      uint64_t domain = 0) const;
  // A new sequence of cache domain `domain` holding `prefix` (whole blocks,
  // all matched in that domain) from the cache; FAILED_PRECONDITION
  // otherwise. Blocks only the host tier holds are copied back into fresh
  // blocks first (RESOURCE_EXHAUSTED when a pool has too few free). The
  // blocks it completes are cached in that domain.
  absl::StatusOr<SequenceId> CreateSequenceFromPrefix(absl::Span<const int32_t> prefix,
                                                      uint64_t domain = 0);

  // Blocks of each pool one sequence of `length` tokens holds at most (its
  // share of a step's new positions included, the step reserve aside): what
  // admission reserves. It does not depend on the pools' sizes.
  std::vector<int64_t> PoolBlocksForLength(int64_t length) const;
  // The fewest blocks a pool of an allocator with options `o` may have (one
  // past the largest step reserve): a probe of that size answers
  // PoolBlocksForLength and StepReserve as a full-size one does.
  static int64_t SmallestValidPool(const KvBlockAllocatorOptions& o) {
    return (o.write_whole_chunk ? o.max_chunk_tokens / o.block_size : 0) + 1;
  }
  // The same, every pool together.
  int64_t BlocksForLength(int64_t length) const;
  // Longest sequence the whole arena could hold on its own.
  int64_t MaxTokens() const;
  // Free blocks of each pool Reserve(seq, n) would take (an upper bound when
  // blocks are shared).
  absl::StatusOr<std::vector<int64_t>> BlocksNeeded(SequenceId seq, int64_t n) const;
  // OK when every pool has `needed` blocks free, else RESOURCE_EXHAUSTED
  // naming the pool, `what` needing them first.
  absl::Status CheckFree(const std::vector<int64_t>& needed, absl::string_view what) const;
  // Makes positions [length, length + n) writable in every group that keeps
  // them: allocates blocks, copying shared ones through `copy`.
  // RESOURCE_EXHAUSTED, changing nothing, when blocks run out.
  absl::Status Reserve(SequenceId seq, int64_t n, CopyBlock copy);
  // The sequence now holds n more tokens; sliding groups free the blocks
  // that left the window. Without the tokens (nullptr) its blocks are not
  // cached from here on.
  absl::Status Commit(SequenceId seq, int64_t n, const int32_t* tokens);

  // First position `group` keeps once the sequence holds `length` tokens.
  int64_t KeepBegin(int group, int64_t length) const;
  // Whether `group` holds position `pos` of a sequence `length` long that
  // reserved it: false for a sliding group's position left out of the window.
  bool Keeps(int group, int64_t length, int64_t pos) const;
  // The sequence's block table for `group`: logical block -> physical, -1 = none.
  const std::vector<int32_t>& Table(SequenceId seq, int group) const;
  int64_t BlocksHeld(SequenceId seq, int group) const;

  int num_pools() const { return blocks_->num_pools(); }
  int pool_of_group(int group) const { return options_.group_pools[group]; }
  // "full-attention", "sliding-window" or "shared": which groups use `pool`.
  const char* pool_name(int pool) const;
  // Blocks of one pool / of every pool together.
  int64_t pool_blocks(int pool) const { return options_.pool_blocks[pool]; }
  int64_t num_blocks() const;
  // Blocks of `pool` admission may reserve: its blocks less the step reserve.
  int64_t admission_blocks(int pool) const { return pool_blocks(pool) - StepReserve(pool); }
  // Blocks no sequence holds (cached ones included: they are evictable),
  // every pool together / of one pool.
  int64_t free_blocks() const { return blocks_->free_blocks(); }
  int64_t free_blocks(int pool) const { return blocks_->free_blocks(pool); }
  const PrefixCache& prefix_cache() const { return *blocks_; }
  // The prefix cache's report for the coordinator (PrefixCache::TakeEvents),
  // with the block size and the sliding window its keys are matched under.
  KvEventBatch TakeEvents(size_t max_keys);
  const KvBlockAllocatorOptions& options() const { return options_; }

 private:
  // A cached block a sliding group no longer holds (it left the window, or
  // a prefix hit never took it), and the key of the token block it caches.
  struct LeftBlock {
    int32_t block = -1;
    uint64_t key = 0;
  };
  struct Sequence {
    int64_t length = 0;
    std::vector<std::vector<int32_t>> tables;  // per group
    // Per group, logical block -> the cached block that left its table;
    // Free refreshes those still cached (PrefixCache::Refresh).
    std::vector<std::vector<LeftBlock>> left;
    PrefixCache::Chain chain;
    int64_t released_blocks = 0;  // sliding groups hold no block below this
  };

  KvBlockAllocator(const KvBlockAllocatorOptions& options, std::unique_ptr<PrefixCache> blocks);
  // Where each whole block at the start of `tokens` can come from: its
  // blocks in the pools (slot -1: none) and, per group, whether the host
  // tier holds it; stops at the first block found nowhere.
  struct BlockSource {
    std::vector<int32_t> slots;
    std::vector<bool> host;
    uint64_t key = 0, parent_key = 0;
    PrefixCache::Link link;  // the pools' entry (Walk), when slots came from one
  };
  std::vector<BlockSource> Sources(absl::Span<const int32_t> tokens, int64_t max_blocks,
                                   uint64_t domain) const;
  // Whether group g of block b is found (in the pools or the host tier).
  static bool Found(const BlockSource& s, size_t g) { return s.slots[g] >= 0 || s.host[g]; }
  // Copies the blocks of `prefix` (whole blocks) the sequence will take
  // and only the host tier holds into fresh blocks and registers them.
  absl::Status RestoreFromHost(absl::Span<const int32_t> prefix, uint64_t domain);
  // A sliding group (or 0 when there is none: KeepBegin is then 0).
  int SlidingGroup() const;
  // Blocks a sliding group's sequence holds at most (see BlocksForLength).
  int64_t SlidingBound() const;
  // Blocks of `pool` kept for one step's new positions in sliding groups.
  int64_t StepReserve(int pool) const;
  // Positions [begin, end) a Reserve of n at `length` writes in `group`.
  void WriteRange(int group, int64_t length, int64_t n, int64_t* begin, int64_t* end) const;
  // Whether each sliding group has the blocks of the window before `blocks`
  // whole blocks (hits: what PrefixCache::Walk found).
  bool WindowCached(const std::vector<BlockSource>& sources, int64_t blocks) const;
  // Notes that logical block `b` of `group` left the table of `s` while
  // `block` caches the token block keyed `key` (nothing when key is 0).
  static void NoteLeft(Sequence& s, size_t group, int64_t b, int32_t block, uint64_t key);

  KvBlockAllocatorOptions options_;
  std::unique_ptr<PrefixCache> blocks_;  // refcounts, free blocks, cached prefixes
  std::unordered_map<SequenceId, Sequence> seqs_;
  SequenceId next_id_ = 1;
};

}  // namespace flotilla
