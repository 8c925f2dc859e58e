// The prefix cache's reports (KvEventLog) as the KvEvents messages a
// DP-group leader sends its coordinator, whose prefix index routes requests
// to the instance that holds the longest prefix of their prompts.
#pragma once

#include <cstddef>
#include <cstdint>

#include "proto/cluster.pb.h"
#include "worker/engine/kv_event_log.h"

namespace flotilla::worker {

// Keys one KvEvents message carries at most (8 bytes each: 64 KiB).
inline constexpr size_t kMaxKvEventKeys = 8192;
// Messages a leader sends after one step at most; a larger resync goes on
// after the next steps.
inline constexpr int kMaxKvEventMessagesPerStep = 8;

// `batch` as the message of DP group `dp_group`'s leader.
cluster::KvEvents KvEventsMessage(const KvEventBatch& batch, uint32_t dp_group);

}  // namespace flotilla::worker
