#include "worker/kv_events_report.h"

namespace flotilla::worker {

cluster::KvEvents KvEventsMessage(const KvEventBatch& batch, uint32_t dp_group) {
  cluster::KvEvents m;
  m.set_reset(batch.reset);
  m.set_dp_group(dp_group);
  m.set_block_size(static_cast<uint32_t>(batch.block_size));
  m.set_sliding_window(static_cast<uint32_t>(batch.sliding_window));
  const std::pair<KvGroupKind, cluster::KvGroupKind> kinds[] = {
      {KvGroupKind::kFullAttention, cluster::KV_GROUP_FULL_ATTENTION},
      {KvGroupKind::kSlidingWindow, cluster::KV_GROUP_SLIDING_WINDOW}};
  for (const auto& [kind, wire] : kinds) {
    const int k = static_cast<int>(kind);
    if (batch.stored[k].empty() && batch.removed[k].empty()) continue;
    cluster::KvGroupEvents* group = m.add_groups();
    group->set_kind(wire);
    group->mutable_stored()->Add(batch.stored[k].begin(), batch.stored[k].end());
    group->mutable_removed()->Add(batch.removed[k].begin(), batch.removed[k].end());
  }
  return m;
}

}  // namespace flotilla::worker
