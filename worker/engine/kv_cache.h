// Paged KV cache of the CPU engine: f32 blocks of one preallocated arena
// shared by all sequences and layers. A block holds `block_size` positions
// of one layer: K [block_size, kv_heads, D] then V [block_size, kv_heads, D].
// The block tables, the sliding window, copy on write and the prefix cache
// are a KvBlockAllocator's (worker/engine/kv_block_allocator.h) with one
// group per layer, all drawing from one pool (a block holds one layer's
// positions, whatever the layer), the same rules the CUDA engine's arena follows; this class
// adds the arena and the rows' addresses. Sliding-window layers write only
// the new positions still in the window at the step's end.
// Not thread-safe: one owner (the engine) drives it.
#pragma once

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/cpu/ops.h"
#include "worker/engine/kv_block_allocator.h"

namespace flotilla {

struct KvCacheOptions {
  std::vector<bool> sliding;  // one per layer
  int64_t window = 0;         // sliding window in tokens (keys a query sees, itself included)
  int64_t kv_heads = 0;       // kv heads this rank holds
  int64_t head_dim = 0;
  int64_t block_size = 16;  // positions per block
  int64_t num_blocks = 0;   // blocks in the arena
  bool prefix_cache = false;  // share full blocks of identical prefixes
  // With prefix_cache: bytes of host memory that keep the cached blocks the
  // arena evicts (KvHostTier; 0 = none), so a later hit copies them back.
  int64_t host_cache_bytes = 0;
};

class KvCache : private KvBlockMover {
 public:
  using SequenceId = int64_t;

  static absl::StatusOr<std::unique_ptr<KvCache>> Create(const KvCacheOptions& options);

  // A new empty sequence.
  SequenceId CreateSequence();
  // A new sequence with the same contents as `source`; blocks are shared until written.
  absl::StatusOr<SequenceId> Fork(SequenceId source);
  // Releases the sequence's blocks (shared blocks stay with their other owners).
  absl::Status Free(SequenceId seq);

  // Prefix cache: how many whole blocks at the start of `tokens` (at most
  // max_blocks) a new sequence can take from the cache: every full layer's
  // blocks up to there and each sliding layer's blocks of the window before it.
  // Only blocks of cache domain `domain` count (KvBlockAllocator::MatchPrefix).
  int64_t MatchPrefix(absl::Span<const int32_t> tokens, int64_t max_blocks,
                      uint64_t domain = 0) const;
  // A new sequence of cache domain `domain` holding `prefix` (whole blocks,
  // all matched) from the cache; FAILED_PRECONDITION otherwise.
  absl::StatusOr<SequenceId> CreateSequenceFromPrefix(absl::Span<const int32_t> prefix,
                                                      uint64_t domain = 0);

  bool Contains(SequenceId seq) const { return blocks_->Contains(seq); }
  absl::Status CheckKnown(SequenceId seq) const { return blocks_->CheckKnown(seq); }
  absl::StatusOr<int64_t> Length(SequenceId seq) const;

  // Blocks one sequence of `length` tokens holds at most, all layers together.
  int64_t BlocksForLength(int64_t length) const;
  // Longest sequence the whole arena could hold on its own.
  int64_t MaxTokens() const;
  // Free blocks Reserve(seq, n) would take (an upper bound when blocks are shared).
  absl::StatusOr<int64_t> BlocksNeeded(SequenceId seq, int64_t n) const;
  // Makes positions [length, length + n) writable: allocates blocks and copies
  // shared ones. RESOURCE_EXHAUSTED, changing nothing, when blocks run out.
  absl::Status Reserve(SequenceId seq, int64_t n);
  // Where to write the K / V row ([kv_heads, D]) of `pos`, which must be
  // reserved; nullptr when the layer does not keep that position (it has
  // already left the sliding window).
  float* KeyRow(SequenceId seq, int layer, int64_t pos);
  float* ValueRow(SequenceId seq, int layer, int64_t pos);
  // The sequence now holds n more tokens; sliding layers free old blocks.
  // Without the tokens its blocks are not cached from here on.
  absl::Status Commit(SequenceId seq, int64_t n);
  // The same, naming the tokens so the blocks they complete are cached.
  absl::Status Commit(SequenceId seq, absl::Span<const int32_t> tokens);
  // The cached positions of one layer, for the attention kernel.
  kernels::cpu::KvCacheView View(SequenceId seq, int layer) const;

  int64_t num_blocks() const { return options_.num_blocks; }
  // Blocks no sequence holds (cached ones included: they are evictable).
  int64_t free_blocks() const { return blocks_->free_blocks(); }
  const PrefixCache& prefix_cache() const { return blocks_->prefix_cache(); }
  // The prefix cache's report for the coordinator (KvBlockAllocator::TakeEvents).
  KvEventBatch TakeEvents(size_t max_keys) { return blocks_->TakeEvents(max_keys); }
  int64_t BlocksHeld(SequenceId seq, int layer) const { return blocks_->BlocksHeld(seq, layer); }
  const KvCacheOptions& options() const { return options_; }
  // The host tier's counters (all zero without one).
  KvHostTierStats host_tier_stats() const {
    return host_tier_ ? host_tier_->stats() : KvHostTierStats{};
  }

 private:
  explicit KvCache(const KvCacheOptions& options);
  float* Row(SequenceId seq, int layer, int64_t pos, bool value);
  // KvBlockMover: a layer's block is block_floats_ floats of the arena.
  size_t BlockBytes(int layer) const override { return block_floats_ * sizeof(float); }
  void ToHost(int layer, int32_t block, uint8_t* host) override;
  void ToDevice(int layer, int32_t block, const uint8_t* host) override;

  KvCacheOptions options_;
  int64_t block_floats_;
  std::vector<float> arena_;
  std::vector<uint8_t> host_arena_;
  std::unique_ptr<KvHostTier> host_tier_;
  std::unique_ptr<KvBlockAllocator> blocks_;
};

}  // namespace flotilla
