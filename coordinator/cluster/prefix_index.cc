#include "coordinator/cluster/prefix_index.h"

#include <algorithm>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "common/prefix_hash.h"

namespace flotilla::coordinator {
namespace {

// The keys of the blocks a prompt can take from a cache of `block_size`:
// whole blocks short of its last token, which is always computed.
std::vector<uint64_t> PromptKeys(uint64_t cache_domain, absl::Span<const int32_t> prompt_ids,
                                 int64_t block_size) {
  if (prompt_ids.size() < 2) return {};
  const int64_t max_blocks = (static_cast<int64_t>(prompt_ids.size()) - 1) / block_size;
  return PrefixBlockKeys(cache_domain, prompt_ids, block_size, max_blocks);
}

absl::Status CheckEvents(const cluster::KvEvents& events) {
  if (events.block_size() == 0) {
    return absl::InvalidArgumentError("kv_events: block_size must be positive, got 0");
  }
  for (const cluster::KvGroupEvents& group : events.groups()) {
    if (group.kind() == cluster::KV_GROUP_FULL_ATTENTION ||
        group.kind() == cluster::KV_GROUP_SLIDING_WINDOW) {
      continue;
    }
    const std::string& name = cluster::KvGroupKind_Name(group.kind());
    return absl::InvalidArgumentError(
        absl::StrCat("kv_events: group kind ", name.empty() ? absl::StrCat(group.kind()) : name,
                     " is not one of KV_GROUP_FULL_ATTENTION, KV_GROUP_SLIDING_WINDOW"));
  }
  return absl::OkStatus();
}

}  // namespace

PrefixIndex::PrefixIndex(size_t max_entries) : max_entries_(std::max<size_t>(1, max_entries)) {}

absl::Status PrefixIndex::Apply(int instance, const cluster::KvEvents& events) {
  if (absl::Status st = CheckEvents(events); !st.ok()) return st;
  std::lock_guard<std::mutex> lock(mu_);
  const SourceId id{instance, events.dp_group()};
  auto it = sources_.find(id);
  // A new block size or window makes the keys held so far meaningless (a
  // new engine starts with a reset anyway).
  if (it != sources_.end() &&
      (events.reset() || it->second.block_size != events.block_size() ||
       it->second.sliding_window != events.sliding_window())) {
    DropSource(it);
  }
  Source& source = sources_[id];
  source.block_size = events.block_size();
  source.sliding_window = events.sliding_window();
  for (const cluster::KvGroupEvents& group : events.groups()) {
    const bool window = group.kind() == cluster::KV_GROUP_SLIDING_WINDOW;
    for (uint64_t key : group.stored()) Mark(id, source, key, window, /*held=*/true);
    for (uint64_t key : group.removed()) Mark(id, source, key, window, /*held=*/false);
  }
  return absl::OkStatus();
}

void PrefixIndex::Mark(const SourceId& id, Source& source, uint64_t key, bool window, bool held) {
  auto it = source.blocks.find(key);
  if (!held) {
    if (it == source.blocks.end()) return;
    (window ? it->second.window : it->second.full) = false;
    if (!it->second.full && !it->second.window) {
      lru_.erase(it->second.lru);
      source.blocks.erase(it);
    }
    return;
  }
  if (it == source.blocks.end()) {
    it = source.blocks.emplace(key, Entry{}).first;
    it->second.lru = lru_.insert(lru_.end(), {id, key});
  } else {
    lru_.splice(lru_.end(), lru_, it->second.lru);  // stored again: the newest
  }
  (window ? it->second.window : it->second.full) = true;
  while (lru_.size() > max_entries_) {
    const auto [oldest_id, oldest_key] = lru_.front();
    lru_.pop_front();
    sources_[oldest_id].blocks.erase(oldest_key);
  }
}

void PrefixIndex::DropSource(std::map<SourceId, Source>::iterator it) {
  for (auto& [key, entry] : it->second.blocks) lru_.erase(entry.lru);
  sources_.erase(it);
}

void PrefixIndex::Forget(int instance) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sources_.lower_bound(SourceId{instance, 0});
  while (it != sources_.end() && it->first.instance == instance) DropSource(it++);
}

int64_t PrefixIndex::MatchedBlocks(const Source& source, const std::vector<uint64_t>& keys) {
  auto held = [&](int64_t block, bool window) {
    auto it = source.blocks.find(keys[block]);
    return it != source.blocks.end() && (window ? it->second.window : it->second.full);
  };
  // The full-attention layers need every block up to the match.
  int64_t full = 0;
  while (full < static_cast<int64_t>(keys.size()) && held(full, false)) ++full;
  if (source.sliding_window <= 0) return full;
  // The sliding-window layers the blocks of the window before its end: the
  // longest match that has them.
  const int64_t bs = source.block_size;
  for (int64_t blocks = full; blocks > 0; --blocks) {
    const int64_t first = std::max<int64_t>(0, blocks * bs - (source.sliding_window - 1)) / bs;
    bool window_held = true;
    for (int64_t b = first; b < blocks && window_held; ++b) window_held = held(b, true);
    if (window_held) return blocks;
  }
  return 0;
}

std::map<int, int64_t> PrefixIndex::MatchedTokensByInstance(
    uint64_t cache_domain, absl::Span<const int32_t> prompt_ids) const {
  // Hash outside the lock: the block sizes first (all equal, normally).
  std::map<int64_t, std::vector<uint64_t>> keys_by_block_size;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [id, source] : sources_) keys_by_block_size[source.block_size];
  }
  for (auto& [block_size, keys] : keys_by_block_size) {
    keys = PromptKeys(cache_domain, prompt_ids, block_size);
  }
  std::map<int, int64_t> matched;
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [id, source] : sources_) {
    int64_t& tokens = matched[id.instance];
    auto keys = keys_by_block_size.find(source.block_size);
    if (keys == keys_by_block_size.end()) continue;  // a source that reported meanwhile
    tokens = std::max(tokens, MatchedBlocks(source, keys->second) * source.block_size);
  }
  return matched;
}

int64_t PrefixIndex::MatchedTokens(int instance, uint64_t cache_domain,
                                   absl::Span<const int32_t> prompt_ids) const {
  std::vector<std::pair<int64_t, std::vector<uint64_t>>> keys_by_block_size;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = sources_.lower_bound(SourceId{instance, 0});
    for (; it != sources_.end() && it->first.instance == instance; ++it) {
      keys_by_block_size.emplace_back(it->second.block_size, std::vector<uint64_t>{});
    }
  }
  for (auto& [block_size, keys] : keys_by_block_size) {
    keys = PromptKeys(cache_domain, prompt_ids, block_size);
  }
  int64_t tokens = 0;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sources_.lower_bound(SourceId{instance, 0});
  for (; it != sources_.end() && it->first.instance == instance; ++it) {
    for (const auto& [block_size, keys] : keys_by_block_size) {
      if (block_size != it->second.block_size) continue;
      tokens = std::max(tokens, MatchedBlocks(it->second, keys) * block_size);
      break;
    }
  }
  return tokens;
}

size_t PrefixIndex::entries() const {
  std::lock_guard<std::mutex> lock(mu_);
  return lru_.size();
}

}  // namespace flotilla::coordinator
