#include "worker/engine/kv_event_log.h"

#include <algorithm>
#include <utility>

namespace flotilla {

size_t KvEventBatch::keys() const {
  size_t n = 0;
  for (int kind = 0; kind < kKvGroupKinds; ++kind) n += stored[kind].size() + removed[kind].size();
  return n;
}

void KvEventLog::Record(KvGroupKind kind, uint64_t key, bool held) {
  if (!recording()) return;
  auto& pending = pending_[static_cast<int>(kind)];
  auto [it, inserted] = pending.try_emplace(key, held);
  if (!inserted) {
    // The opposite of an unsent change: together they change nothing.
    if (it->second != held) {
      pending.erase(it);
      --pending_keys_;
    }
    return;
  }
  if (++pending_keys_ <= max_pending_) return;
  resync_needed_ = true;
  for (int k = 0; k < kKvGroupKinds; ++k) {
    pending_[k].clear();
    snapshot_[k].clear();
    snapshot_sent_[k] = 0;
  }
  pending_keys_ = 0;
}

void KvEventLog::Resync(std::vector<uint64_t> held[kKvGroupKinds]) {
  armed_ = true;
  resync_needed_ = false;
  send_reset_ = true;
  pending_keys_ = 0;
  for (int kind = 0; kind < kKvGroupKinds; ++kind) {
    pending_[kind].clear();
    snapshot_[kind] = std::move(held[kind]);
    snapshot_sent_[kind] = 0;
  }
}

KvEventBatch KvEventLog::Take(size_t max_keys) {
  KvEventBatch batch;
  batch.reset = std::exchange(send_reset_, false);
  size_t room = max_keys;
  bool from_snapshot = false;
  for (int kind = 0; kind < kKvGroupKinds; ++kind) {
    const auto& snapshot = snapshot_[kind];
    size_t& sent = snapshot_sent_[kind];
    const size_t n = std::min(room, snapshot.size() - sent);
    batch.stored[kind].assign(snapshot.begin() + sent, snapshot.begin() + sent + n);
    sent += n;
    room -= n;
    from_snapshot = from_snapshot || n > 0;
  }
  // Changes apply to the whole snapshot, so they go in the reports after its
  // last one (a report mixing both could store and remove one key).
  if (from_snapshot) return batch;
  for (int kind = 0; kind < kKvGroupKinds; ++kind) {
    snapshot_[kind].clear();
    snapshot_sent_[kind] = 0;
    auto& pending = pending_[kind];
    for (auto it = pending.begin(); it != pending.end() && room > 0; --room) {
      (it->second ? batch.stored[kind] : batch.removed[kind]).push_back(it->first);
      it = pending.erase(it);
      --pending_keys_;
    }
  }
  return batch;
}

}  // namespace flotilla
