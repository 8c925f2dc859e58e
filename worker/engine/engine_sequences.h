// FreeSequence and SequenceLength as every engine answers them, over its KV
// block tables: a KvCache on the host, a KvBlockAllocator on the GPU (both
// have CheckKnown, Free and Length). A sequence the engine does not hold is
// INVALID_ARGUMENT "unknown sequence N" (the caller's mistake), never the
// tables' NOT_FOUND.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/status.h"

namespace flotilla {

// Frees `sequence`'s blocks and forgets its last draft (`drafts`: each
// sequence's last draft, as the engine keeps them).
template <typename Kv>
absl::Status FreeKnownSequence(Kv& kv, std::unordered_map<int64_t, std::vector<int32_t>>& drafts,
                               int64_t sequence) {
  FLOTILLA_RETURN_IF_ERROR(kv.CheckKnown(sequence));
  drafts.erase(sequence);
  return kv.Free(sequence);
}

// The tokens `sequence` holds.
template <typename Kv>
absl::StatusOr<int64_t> KnownSequenceLength(const Kv& kv, int64_t sequence) {
  FLOTILLA_RETURN_IF_ERROR(kv.CheckKnown(sequence));
  return kv.Length(sequence);
}

}  // namespace flotilla
