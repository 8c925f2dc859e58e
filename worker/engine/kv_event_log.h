// What a prefix cache tells the coordinator's prefix index: the keys
// (common/prefix_hash.h) of the token blocks it came to hold and those it
// stopped holding, per kind of KV group (a block counts as held by a kind
// when every layer group of that kind has it), since the last report.
//
// Changes are kept as the net difference from what was last reported, so a
// block stored and evicted between two reports is never sent, and a
// report's stored and removed keys are disjoint. The unsent changes are
// bounded: past `max_pending` keys they are dropped and the next report is
// a resync (reset, then a snapshot of every held key, in as many reports as
// it takes). Nothing is recorded until the first Take, which is a resync
// too, so an engine whose reports nobody takes keeps no log.
// Not thread-safe: the engine's owner drives it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

namespace flotilla {

// Which layer groups a kind covers: full attention, or sliding window.
enum class KvGroupKind { kFullAttention = 0, kSlidingWindow = 1 };
inline constexpr int kKvGroupKinds = 2;

// One report.
struct KvEventBatch {
  bool reset = false;  // the receiver forgets what came before
  // What the keys describe (set by KvBlockAllocator): tokens per block and
  // the sliding window in tokens (0 = no sliding-window group).
  int64_t block_size = 0;
  int64_t sliding_window = 0;
  std::vector<uint64_t> stored[kKvGroupKinds];
  std::vector<uint64_t> removed[kKvGroupKinds];

  size_t keys() const;
  bool empty() const { return !reset && keys() == 0; }
};

class KvEventLog {
 public:
  explicit KvEventLog(size_t max_pending) : max_pending_(max_pending) {}

  // Whether changes are being recorded (a Take came, no overflow since).
  bool recording() const { return armed_ && !resync_needed_; }
  // Whether the next Take must start with a snapshot (Resync).
  bool needs_snapshot() const { return resync_needed_; }
  // The block `key` came to be held (held = true) or stopped being held by
  // the groups of `kind`.
  void Record(KvGroupKind kind, uint64_t key, bool held);
  // Starts a resync from `held`, every key each kind holds now.
  void Resync(std::vector<uint64_t> held[kKvGroupKinds]);
  // The next report, at most `max_keys` keys (the snapshot's first).
  KvEventBatch Take(size_t max_keys);

 private:
  size_t max_pending_;
  bool armed_ = false;
  bool resync_needed_ = true;
  bool send_reset_ = false;
  // key -> held, relative to what the receiver has (or will have once the
  // snapshot is sent).
  std::unordered_map<uint64_t, bool> pending_[kKvGroupKinds];
  size_t pending_keys_ = 0;
  std::vector<uint64_t> snapshot_[kKvGroupKinds];
  size_t snapshot_sent_[kKvGroupKinds] = {0, 0};
};

}  // namespace flotilla
