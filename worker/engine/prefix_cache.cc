#include "worker/engine/prefix_cache.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/prefix_hash.h"

namespace flotilla {

absl::StatusOr<std::unique_ptr<PrefixCache>> PrefixCache::Create(PrefixCacheOptions options) {
  if (options.pool_blocks.empty()) options.pool_blocks = {options.num_blocks};
  if (options.slot_pools.empty()) options.slot_pools.assign(std::max(options.slots, 0), 0);
  bool positive = options.block_size > 0 && options.first_block >= 0 && options.slots > 0;
  for (int32_t n : options.pool_blocks) positive = positive && n > 0;
  if (!positive) {
    return absl::InvalidArgumentError(
        absl::StrCat("prefix cache: block_size ", options.block_size, ", every pool's blocks (",
                     absl::StrJoin(options.pool_blocks, ", "), ") and slots ", options.slots,
                     " must be positive, first_block non-negative"));
  }
  if (!options.window_slots.empty() &&
      options.window_slots.size() != static_cast<size_t>(options.slots)) {
    return absl::InvalidArgumentError(absl::StrCat("prefix cache: ", options.window_slots.size(),
                                                   " window_slots for ", options.slots, " slots"));
  }
  if (options.slot_pools.size() != static_cast<size_t>(options.slots)) {
    return absl::InvalidArgumentError(absl::StrCat("prefix cache: ", options.slot_pools.size(),
                                                   " slot_pools for ", options.slots, " slots"));
  }
  for (int pool : options.slot_pools) {
    if (pool < 0 || pool >= static_cast<int>(options.pool_blocks.size())) {
      return absl::InvalidArgumentError(absl::StrCat("prefix cache: a slot's pool ", pool,
                                                     " is not one of the ",
                                                     options.pool_blocks.size(), " pools"));
    }
  }
  return std::unique_ptr<PrefixCache>(new PrefixCache(std::move(options)));
}

PrefixCache::PrefixCache(PrefixCacheOptions options)
    : options_(std::move(options)),
      window_slot_(options_.window_slots.empty() ? std::vector<bool>(options_.slots, false)
                                                 : options_.window_slots),
      window_slot_count_(
          static_cast<int>(std::count(window_slot_.begin(), window_slot_.end(), true))),
      events_(options_.max_pending_events),
      slot_pool_(options_.slot_pools),
      pools_(options_.pool_blocks.size()) {
  for (size_t p = 0; p < pools_.size(); ++p) {
    Pool& pool = pools_[p];
    const int32_t n = options_.pool_blocks[p];
    pool.refcount.assign(n, 0);
    pool.entry_of.assign(n, 0);
    pool.slot_of.assign(n, -1);
    pool.lru_prev.assign(n, -1);
    pool.lru_next.assign(n, -1);
    pool.plain_free.reserve(n);
    // Hand out low block numbers first.
    for (int32_t i = n - 1; i >= 0; --i) pool.plain_free.push_back(i);
  }
}

uint64_t PrefixCache::Key(uint64_t parent, absl::Span<const int32_t> tokens) const {
  if (!options_.hash) return PrefixBlockKey(parent, tokens);
  const uint64_t key = options_.hash(parent, tokens);
  return key == 0 ? 1 : key;  // 0 marks "no entry"
}

// ---- allocation ----

int64_t PrefixCache::free_blocks() const {
  int64_t n = 0;
  for (int p = 0; p < num_pools(); ++p) n += free_blocks(p);
  return n;
}

int64_t PrefixCache::cached_free_blocks() const {
  int64_t n = 0;
  for (const Pool& pool : pools_) n += pool.lru_size;
  return n;
}

std::optional<int32_t> PrefixCache::Allocate(int p) {
  Pool& pool = pools_[p];
  int32_t index;
  if (!pool.plain_free.empty()) {
    index = pool.plain_free.back();
    pool.plain_free.pop_back();
  } else if (pool.lru_head >= 0) {
    index = pool.lru_head;
    LruRemove(pool, index);
    if (options_.on_evict) {
      auto it = entries_.find(pool.entry_of[index]);
      if (it != entries_.end()) {
        options_.on_evict(pool.slot_of[index], index + options_.first_block, it->first,
                          it->second.parent_key, it->second.tokens);
      }
    }
    Forget(pool, index);
  } else {
    return std::nullopt;
  }
  pool.refcount[index] = 1;
  return index + options_.first_block;
}

void PrefixCache::Hold(int32_t block, int p) {
  Pool& pool = pools_[p];
  const int32_t index = block - options_.first_block;
  if (pool.refcount[index]++ == 0 && pool.entry_of[index] != 0) LruRemove(pool, index);
}

void PrefixCache::Release(int32_t block, int p) {
  Pool& pool = pools_[p];
  const int32_t index = block - options_.first_block;
  if (--pool.refcount[index] > 0) return;
  if (pool.entry_of[index] != 0) {
    LruPushBack(pool, index);
  } else {
    pool.plain_free.push_back(index);
  }
}

void PrefixCache::Refresh(int32_t block, uint64_t key, int p) {
  Pool& pool = pools_[p];
  const int32_t index = block - options_.first_block;
  if (key == 0 || pool.refcount[index] != 0 || pool.entry_of[index] != key) return;
  LruRemove(pool, index);
  LruPushBack(pool, index);
}

void PrefixCache::LruPushBack(Pool& pool, int32_t index) {
  pool.lru_prev[index] = pool.lru_tail;
  pool.lru_next[index] = -1;
  if (pool.lru_tail >= 0) {
    pool.lru_next[pool.lru_tail] = index;
  } else {
    pool.lru_head = index;
  }
  pool.lru_tail = index;
  ++pool.lru_size;
}

void PrefixCache::LruRemove(Pool& pool, int32_t index) {
  const int32_t prev = pool.lru_prev[index], next = pool.lru_next[index];
  if (prev >= 0) {
    pool.lru_next[prev] = next;
  } else {
    pool.lru_head = next;
  }
  if (next >= 0) {
    pool.lru_prev[next] = prev;
  } else {
    pool.lru_tail = prev;
  }
  pool.lru_prev[index] = pool.lru_next[index] = -1;
  --pool.lru_size;
}

void PrefixCache::Forget(Pool& pool, int32_t index) {
  auto it = entries_.find(pool.entry_of[index]);
  pool.entry_of[index] = 0;
  const int slot = pool.slot_of[index];
  pool.slot_of[index] = -1;
  if (it == entries_.end()) return;
  Entry& entry = it->second;
  const Held before = HeldBy(&entry);
  entry.slots[slot] = -1;
  if (window_slot_[slot]) --entry.live_window_slots;
  if (--entry.live_slots == 0) {
    Erase(it, before);
  } else {
    Report(it->first, before, HeldBy(&entry));
  }
}

// ---- the index ----

PrefixCache::Link PrefixCache::Root(uint64_t domain) {
  // Registered blocks count their serials up from 1 and never reach 2^63.
  if (domain == 0) return Link{PrefixRootKey(0), 0};
  return Link{PrefixRootKey(domain), domain | (uint64_t{1} << 63)};
}

std::vector<PrefixCache::Hit> PrefixCache::Walk(absl::Span<const int32_t> tokens,
                                                int64_t max_blocks, Link root) const {
  std::vector<Hit> hits;
  if (!options_.enabled) return hits;
  const int64_t bs = options_.block_size;
  max_blocks = std::min<int64_t>(max_blocks, static_cast<int64_t>(tokens.size()) / bs);
  Link parent = root;
  for (int64_t b = 0; b < max_blocks; ++b) {
    absl::Span<const int32_t> block = tokens.subspan(b * bs, bs);
    const uint64_t key = Key(parent.key, block);
    auto it = entries_.find(key);
    if (it == entries_.end()) break;
    const Entry& e = it->second;
    if (e.parent_serial != parent.serial || !std::equal(block.begin(), block.end(),
                                                        e.tokens.begin(), e.tokens.end())) {
      break;  // a collision: another block under this key
    }
    parent = Link{key, e.serial};
    hits.push_back(Hit{parent, e.slots});
  }
  return hits;
}

void PrefixCache::Extend(
    Chain* chain, absl::Span<const int32_t> tokens,
    absl::FunctionRef<void(int64_t block, std::vector<int32_t>* slots)> slots_of) {
  if (!options_.enabled || chain->broken) return;
  const size_t bs = static_cast<size_t>(options_.block_size);
  std::vector<int32_t> slots;
  for (int32_t t : tokens) {
    chain->partial.push_back(t);
    if (chain->partial.size() < bs) continue;
    slots.assign(options_.slots, -1);
    slots_of(chain->blocks, &slots);
    std::optional<Link> link = Insert(chain->link, chain->partial, slots);
    chain->partial.clear();
    if (!link) {
      chain->broken = true;
      return;
    }
    chain->link = *link;
    ++chain->blocks;
  }
}

std::optional<PrefixCache::Link> PrefixCache::Insert(Link parent, absl::Span<const int32_t> tokens,
                                                     const std::vector<int32_t>& slots) {
  const uint64_t key = Key(parent.key, tokens);
  auto it = entries_.find(key);
  if (it != entries_.end()) {
    Entry& e = it->second;
    const bool same = e.parent_serial == parent.serial &&
                      std::equal(tokens.begin(), tokens.end(), e.tokens.begin(), e.tokens.end());
    if (same) {
      AddSlots(e, key, slots);
      return Link{key, e.serial};
    }
    if (!DropIfUnheld(key)) return std::nullopt;
  }
  Entry& e = entries_[key];
  e.serial = next_serial_++;
  e.parent_serial = parent.serial;
  e.parent_key = parent.key;
  e.tokens.assign(tokens.begin(), tokens.end());
  e.slots.assign(options_.slots, -1);
  Attach(key, e);
  AddSlots(e, key, slots);
  if (e.live_slots == 0) {
    Erase(entries_.find(key), Held{});
    return std::nullopt;
  }
  return Link{key, e.serial};
}

void PrefixCache::AddSlots(Entry& entry, uint64_t key, const std::vector<int32_t>& slots) {
  const Held before = HeldBy(&entry);
  for (int s = 0; s < options_.slots; ++s) {
    const int32_t block = slots[s];
    if (block < 0 || entry.slots[s] >= 0) continue;
    Pool& pool = pools_[slot_pool_[s]];
    const int32_t index = block - options_.first_block;
    // Only a block a sequence holds (so not in a free list) and that caches
    // nothing else can join.
    if (pool.refcount[index] == 0 || pool.entry_of[index] != 0) continue;
    entry.slots[s] = block;
    pool.entry_of[index] = key;
    pool.slot_of[index] = s;
    ++entry.live_slots;
    if (window_slot_[s]) ++entry.live_window_slots;
  }
  Report(key, before, HeldBy(&entry));
}

bool PrefixCache::DropIfUnheld(uint64_t key) {
  Entry& e = entries_.at(key);
  for (int s = 0; s < options_.slots; ++s) {
    if (e.slots[s] >= 0 && refcount(e.slots[s], slot_pool_[s]) > 0) return false;
  }
  const Held before = HeldBy(&e);
  for (int s = 0; s < options_.slots; ++s) {
    if (e.slots[s] < 0) continue;
    Pool& pool = pools_[slot_pool_[s]];
    const int32_t index = e.slots[s] - options_.first_block;
    LruRemove(pool, index);
    pool.entry_of[index] = 0;
    pool.slot_of[index] = -1;
    pool.plain_free.push_back(index);
  }
  Erase(entries_.find(key), before);
  return true;
}

void PrefixCache::Attach(uint64_t key, Entry& entry) {
  // A chain's first block hangs from a root (serial 0 or >= 2^63), no entry.
  if (entry.parent_serial == 0 || entry.parent_serial >= (uint64_t{1} << 63)) return;
  auto parent = entries_.find(entry.parent_key);
  if (parent == entries_.end() || parent->second.serial != entry.parent_serial ||
      parent->second.unreachable) {
    entry.unreachable = true;
    return;
  }
  parent->second.children.push_back(key);
}

void PrefixCache::Erase(std::unordered_map<uint64_t, Entry>::iterator it, Held before) {
  const uint64_t key = it->first;
  Entry& entry = it->second;
  Report(key, before, Held{});
  auto parent = entries_.find(entry.parent_key);
  if (parent != entries_.end() && parent->second.serial == entry.parent_serial) {
    std::vector<uint64_t>& siblings = parent->second.children;
    auto self = std::find(siblings.begin(), siblings.end(), key);
    if (self != siblings.end()) {
      *self = siblings.back();
      siblings.pop_back();
    }
  }
  // Everything below it: (key, the serial its parent must have).
  std::vector<std::pair<uint64_t, uint64_t>> below;
  for (uint64_t child : entry.children) below.emplace_back(child, entry.serial);
  entries_.erase(it);
  while (!below.empty()) {
    const auto [child_key, parent_serial] = below.back();
    below.pop_back();
    auto child = entries_.find(child_key);
    if (child == entries_.end() || child->second.parent_serial != parent_serial ||
        child->second.unreachable) {
      continue;
    }
    const Held before = HeldBy(&child->second);
    child->second.unreachable = true;
    Report(child_key, before, Held{});
    for (uint64_t grandchild : child->second.children) {
      below.emplace_back(grandchild, child->second.serial);
    }
    child->second.children.clear();
  }
}

// ---- events ----

PrefixCache::Held PrefixCache::HeldBy(const Entry* entry) const {
  if (entry == nullptr || entry->live_slots == 0 || entry->unreachable) return Held{};
  const int full_slots = options_.slots - window_slot_count_;
  Held held;
  held.full = entry->live_slots - entry->live_window_slots == full_slots;
  held.window = window_slot_count_ > 0 && entry->live_window_slots == window_slot_count_;
  return held;
}

void PrefixCache::Report(uint64_t key, Held before, Held after) {
  if (!events_.recording()) return;
  if (before.full != after.full) events_.Record(KvGroupKind::kFullAttention, key, after.full);
  if (before.window != after.window) events_.Record(KvGroupKind::kSlidingWindow, key, after.window);
}

KvEventBatch PrefixCache::TakeEvents(size_t max_keys) {
  if (events_.needs_snapshot()) {
    std::vector<uint64_t> held[kKvGroupKinds];
    for (const auto& [key, entry] : entries_) {
      const Held h = HeldBy(&entry);
      if (h.full) held[static_cast<int>(KvGroupKind::kFullAttention)].push_back(key);
      if (h.window) held[static_cast<int>(KvGroupKind::kSlidingWindow)].push_back(key);
    }
    events_.Resync(held);
  }
  return events_.Take(max_keys);
}

}  // namespace flotilla
