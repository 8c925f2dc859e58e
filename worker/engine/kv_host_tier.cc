#include "worker/engine/kv_host_tier.h"

#include <algorithm>

namespace flotilla {

KvHostTier::KvHostTier(uint8_t* arena, size_t slot_bytes, int64_t slots)
    : arena_(arena), slot_bytes_(slot_bytes), capacity_slots_(std::max<int64_t>(0, slots)) {
  free_slots_.reserve(capacity_slots_);
  for (int64_t s = capacity_slots_ - 1; s >= 0; --s) free_slots_.push_back(s);
  stats_.capacity_bytes = static_cast<int64_t>(slot_bytes_) * capacity_slots_;
}

KvHostTier::Lru::iterator KvHostTier::Find(uint64_t key, int group, uint64_t parent_key,
                                           absl::Span<const int32_t> tokens) const {
  auto [begin, end] = index_.equal_range(IdOf(key, group));
  for (auto it = begin; it != end; ++it) {
    const Entry& e = *it->second;
    if (e.key == key && e.group == group && e.parent_key == parent_key &&
        std::equal(tokens.begin(), tokens.end(), e.tokens.begin(), e.tokens.end())) {
      return it->second;
    }
  }
  return lru_.end();
}

uint8_t* KvHostTier::Store(uint64_t key, int group, uint64_t parent_key,
                           absl::Span<const int32_t> tokens, size_t bytes) {
  if (bytes > slot_bytes_ || capacity_slots_ == 0 || frozen_) return nullptr;
  if (auto it = Find(key, group, parent_key, tokens); it != lru_.end()) {
    lru_.splice(lru_.end(), lru_, it);
    return nullptr;
  }
  if (free_slots_.empty()) {
    // The least recently used entry makes room.
    const Entry& victim = lru_.front();
    auto [begin, end] = index_.equal_range(IdOf(victim.key, victim.group));
    for (auto it = begin; it != end; ++it) {
      if (it->second == lru_.begin()) {
        index_.erase(it);
        break;
      }
    }
    free_slots_.push_back(victim.slot);
    stats_.used_bytes -= static_cast<int64_t>(victim.bytes);
    ++stats_.evicted_blocks;
    lru_.pop_front();
  }
  Entry e;
  e.key = key;
  e.group = group;
  e.parent_key = parent_key;
  e.tokens.assign(tokens.begin(), tokens.end());
  e.bytes = bytes;
  e.slot = free_slots_.back();
  free_slots_.pop_back();
  lru_.push_back(std::move(e));
  index_.emplace(IdOf(key, group), std::prev(lru_.end()));
  stats_.used_bytes += static_cast<int64_t>(bytes);
  stats_.bytes_to_host += static_cast<int64_t>(bytes);
  ++stats_.stored_blocks;
  return arena_ + static_cast<size_t>(lru_.back().slot) * slot_bytes_;
}

bool KvHostTier::Contains(uint64_t key, int group, uint64_t parent_key,
                          absl::Span<const int32_t> tokens) const {
  return Find(key, group, parent_key, tokens) != lru_.end();
}

const uint8_t* KvHostTier::Load(uint64_t key, int group, uint64_t parent_key,
                                absl::Span<const int32_t> tokens) {
  auto it = Find(key, group, parent_key, tokens);
  if (it == lru_.end()) return nullptr;
  lru_.splice(lru_.end(), lru_, it);
  ++stats_.hit_blocks;
  stats_.bytes_to_device += static_cast<int64_t>(it->bytes);
  return arena_ + static_cast<size_t>(it->slot) * slot_bytes_;
}

}  // namespace flotilla
