// Paged KV cache: fixed-size blocks from one preallocated arena shared by all
// sequences and layers. A block holds `block_size` positions of one layer:
// K [block_size, kv_heads, D] then V [block_size, kv_heads, D], in f32.
// Full-attention layers keep every position; sliding-window layers keep only
// the last window - 1 positions (what the next query needs besides itself) and
// free the blocks that leave the window. Forks share blocks (reference
// counted) and copy a block only when one of them writes into it.
// With prefix_cache on, every full block a sequence completes is registered
// in a PrefixCache (worker/engine/prefix_cache.h) with its blocks of every
// layer, and a new sequence can start from a cached prefix, sharing its
// blocks. Sliding layers then write whole blocks (from the block start of
// the window before the last block boundary short of the chunk's end), so a cached block's
// sliding-layer KV is complete; blocks leaving the window are released as
// before but stay cached (and evictable) until the arena needs them.
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
#include "worker/engine/prefix_cache.h"

namespace flotilla {

struct KvCacheOptions {
  std::vector<bool> sliding;  // one per layer
  int64_t window = 0;         // sliding window in tokens (keys a query sees, itself included)
  int64_t kv_heads = 0;       // kv heads this rank holds
  int64_t head_dim = 0;
  int64_t block_size = 16;  // positions per block
  int64_t num_blocks = 0;   // blocks in the arena
  bool prefix_cache = false;  // share full blocks of identical prefixes
};

class KvCache {
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
  int64_t MatchPrefix(absl::Span<const int32_t> tokens, int64_t max_blocks) const;
  // A new sequence holding `prefix` (whole blocks, all matched) from the
  // cache; FAILED_PRECONDITION otherwise.
  absl::StatusOr<SequenceId> CreateSequenceFromPrefix(absl::Span<const int32_t> prefix);

  bool Contains(SequenceId seq) const { return seqs_.count(seq) != 0; }
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
  const PrefixCache& prefix_cache() const { return *blocks_; }
  int64_t BlocksHeld(SequenceId seq, int layer) const;
  const KvCacheOptions& options() const { return options_; }

 private:
  struct Sequence {
    int64_t length = 0;
    std::vector<std::vector<int32_t>> tables;  // per layer: logical block -> physical, -1 = none
    PrefixCache::Chain chain;
    int64_t released_blocks = 0;  // sliding layers hold no block below this
  };

  KvCache(const KvCacheOptions& options, std::unique_ptr<PrefixCache> blocks);
  // First position layer `layer` keeps once the sequence holds `length` tokens.
  int64_t KeepBegin(int layer, int64_t length) const;
  // A sliding layer (or 0 when there is none: KeepBegin is then 0).
  int SlidingLayer() const;
  // Positions [begin, end) a Reserve of n at `length` writes in `layer`.
  void WriteRange(int layer, int64_t length, int64_t n, int64_t* begin, int64_t* end) const;
  int32_t Allocate();
  void Release(int32_t block);
  // Registers the blocks `tokens` complete, then frees what left the window.
  absl::Status CommitTokens(SequenceId seq, int64_t n, const int32_t* tokens);
  // Whether each sliding layer has the blocks of the window before `blocks`
  // whole blocks (hits: what PrefixCache::Walk found).
  bool WindowCached(const std::vector<PrefixCache::Hit>& hits, int64_t blocks) const;
  float* Row(SequenceId seq, int layer, int64_t pos, bool value);

  KvCacheOptions options_;
  int64_t block_floats_;
  std::vector<float> arena_;
  std::unique_ptr<PrefixCache> blocks_;  // refcounts, free blocks, cached prefixes
  std::unordered_map<SequenceId, Sequence> seqs_;
  SequenceId next_id_ = 1;
};

}  // namespace flotilla
