#include "worker/engine/kv_block_allocator.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace flotilla {

absl::StatusOr<std::unique_ptr<KvBlockAllocator>> KvBlockAllocator::Create(
    const KvBlockAllocatorOptions& options) {
  KvBlockAllocatorOptions o = options;
  if (o.sliding.empty()) return absl::InvalidArgumentError("kv cache: no layer groups");
  if (o.block_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv cache: block_size must be positive, got ", o.block_size));
  }
  if (o.pool_blocks.empty()) o.pool_blocks = {o.num_blocks};
  if (o.group_pools.empty()) o.group_pools.assign(o.sliding.size(), 0);
  if (o.group_pools.size() != o.sliding.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "kv cache: ", o.group_pools.size(), " group pools for ", o.sliding.size(), " groups"));
  }
  for (int64_t n : o.pool_blocks) {
    if (n <= 0 || o.first_block < 0 || n + o.first_block > INT32_MAX) {
      return absl::InvalidArgumentError(
          absl::StrCat("kv cache: every pool's blocks must be in [1, 2^31), got ", n));
    }
  }
  const bool any_sliding = std::find(o.sliding.begin(), o.sliding.end(), true) != o.sliding.end();
  if (any_sliding && o.window <= 0) {
    return absl::InvalidArgumentError("kv cache: sliding layers need a positive window");
  }
  if (any_sliding && o.write_whole_chunk && o.max_chunk_tokens <= 0) {
    return absl::InvalidArgumentError("kv cache: whole-chunk writes need max_chunk_tokens");
  }
  PrefixCacheOptions po;
  po.block_size = o.block_size;
  po.first_block = o.first_block;
  po.num_blocks = static_cast<int32_t>(o.pool_blocks[0]);
  for (int64_t n : o.pool_blocks) po.pool_blocks.push_back(static_cast<int32_t>(n));
  po.slots = static_cast<int>(o.sliding.size());
  po.slot_pools = o.group_pools;
  po.enabled = o.prefix_cache;
  po.window_slots = o.sliding;
  if ((o.host_tier == nullptr) != (o.mover == nullptr)) {
    return absl::InvalidArgumentError("kv cache: a host tier needs a block mover and back");
  }
  if (o.host_tier != nullptr && o.prefix_cache) {
    // An evicted cached block goes to the host tier (slot = group).
    po.on_evict = [tier = o.host_tier, mover = o.mover](int group, int32_t block, uint64_t key,
                                                        uint64_t parent_key,
                                                        absl::Span<const int32_t> tokens) {
      uint8_t* slot = tier->Store(key, group, parent_key, tokens, mover->BlockBytes(group));
      if (slot != nullptr) mover->ToHost(group, block, slot);
    };
  }
  absl::StatusOr<std::unique_ptr<PrefixCache>> blocks = PrefixCache::Create(po);
  if (!blocks.ok()) return blocks.status();
  o.num_blocks = 0;
  for (int64_t n : o.pool_blocks) o.num_blocks += n;
  auto kv = std::unique_ptr<KvBlockAllocator>(new KvBlockAllocator(o, std::move(*blocks)));
  for (int p = 0; p < kv->num_pools(); ++p) {
    if (kv->admission_blocks(p) <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("kv cache: the ", kv->pool_name(p), " pool's ", kv->pool_blocks(p),
                       " blocks leave none beside the ", kv->StepReserve(p),
                       " kept for one step's new sliding-window positions"));
    }
  }
  return kv;
}

KvBlockAllocator::KvBlockAllocator(const KvBlockAllocatorOptions& o,
                                   std::unique_ptr<PrefixCache> blocks)
    : options_(o), blocks_(std::move(blocks)) {}

KvBlockAllocator::SequenceId KvBlockAllocator::CreateSequence() {
  SequenceId id = next_id_++;
  seqs_[id].tables.resize(options_.sliding.size());
  seqs_[id].left.resize(options_.sliding.size());
  return id;
}

void KvBlockAllocator::NoteLeft(Sequence& s, size_t group, int64_t b, int32_t block, uint64_t key) {
  if (key == 0) return;
  auto& left = s.left[group];
  if (static_cast<int64_t>(left.size()) <= b) left.resize(b + 1);
  left[b] = LeftBlock{block, key};
}

absl::StatusOr<KvBlockAllocator::SequenceId> KvBlockAllocator::Fork(SequenceId source) {
  auto it = seqs_.find(source);
  if (it == seqs_.end()) {
    return absl::NotFoundError(absl::StrCat("kv cache: no sequence ", source));
  }
  SequenceId id = next_id_++;
  Sequence copy = it->second;
  for (size_t g = 0; g < copy.tables.size(); ++g) {
    for (int32_t b : copy.tables[g]) {
      if (b >= 0) blocks_->Hold(b, pool_of_group(static_cast<int>(g)));
    }
  }
  seqs_.emplace(id, std::move(copy));
  return id;
}

absl::Status KvBlockAllocator::CheckKnown(SequenceId seq) const {
  if (Contains(seq)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("unknown sequence ", seq));
}

absl::Status KvBlockAllocator::Free(SequenceId seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return absl::NotFoundError(absl::StrCat("kv cache: no sequence ", seq));
  // Last blocks first: a prefix's first blocks, which every longer match
  // needs, are then the most recently freed and the last evicted. Cached
  // blocks that left a sliding window earlier take their place in that
  // order too, unless they were evicted or taken again since.
  const Sequence& s = it->second;
  size_t longest = 0;
  for (const auto& table : s.tables) longest = std::max(longest, table.size());
  for (size_t b = longest; b-- > 0;) {
    for (size_t g = 0; g < s.tables.size(); ++g) {
      const auto& table = s.tables[g];
      const int pool = pool_of_group(static_cast<int>(g));
      if (b < table.size() && table[b] >= 0) {
        blocks_->Release(table[b], pool);
      } else if (b < s.left[g].size() && s.left[g][b].block >= 0) {
        blocks_->Refresh(s.left[g][b].block, s.left[g][b].key, pool);
      }
    }
  }
  seqs_.erase(it);
  return absl::OkStatus();
}

absl::StatusOr<int64_t> KvBlockAllocator::Length(SequenceId seq) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return absl::NotFoundError(absl::StrCat("kv cache: no sequence ", seq));
  return it->second.length;
}

int KvBlockAllocator::SlidingGroup() const {
  auto it = std::find(options_.sliding.begin(), options_.sliding.end(), true);
  return it == options_.sliding.end() ? 0 : static_cast<int>(it - options_.sliding.begin());
}

int64_t KvBlockAllocator::KeepBegin(int group, int64_t length) const {
  if (!options_.sliding[group]) return 0;
  return std::max<int64_t>(0, length - (options_.window - 1));
}

bool KvBlockAllocator::Keeps(int group, int64_t length, int64_t pos) const {
  return !options_.sliding[group] || pos >= KeepBegin(group, length);
}

void KvBlockAllocator::WriteRange(int group, int64_t length, int64_t n, int64_t* begin,
                                  int64_t* end) const {
  *end = length + n;
  if (options_.write_whole_chunk || !options_.sliding[group]) {
    *begin = length;
    return;
  }
  *begin = std::max(length, KeepBegin(group, length + n));
  if (options_.prefix_cache) {
    // Whole blocks from the window before the last block boundary short of
    // the end (a prompt's match stops before its last token), so that a
    // prefix ending there finds its sliding-group KV complete.
    const int64_t bs = options_.block_size;
    const int64_t boundary = (*end - 1) / bs * bs;
    const int64_t first = std::max<int64_t>(0, boundary - (options_.window - 1)) / bs * bs;
    *begin = std::max(length, std::min(*begin, first));
  }
}

int64_t KvBlockAllocator::SlidingBound() const {
  const int64_t bs = options_.block_size;
  const int64_t w = options_.window;
  if (options_.write_whole_chunk) {
    // Its window - 1 kept positions and a chunk of c new ones span at most
    // floor((w - 2 + c) / bs) + 2 <= floor((w - 2) / bs) + floor(c / bs) + 3
    // blocks; the floor(c / bs) of every sequence of a step together are at
    // most the step reserve.
    return (w - 2) / bs + 3;
  }
  if (options_.prefix_cache) {
    // The new ones start up to two blocks earlier.
    return (w + bs - 2) / bs + 1 + (w + 2 * bs) / bs + 2;
  }
  // The window - 1 kept positions and up to window - 1 new ones.
  return (2 * w + bs - 1) / bs + 1;
}

int64_t KvBlockAllocator::StepReserve(int pool) const {
  if (!options_.write_whole_chunk) return 0;
  for (size_t g = 0; g < options_.sliding.size(); ++g) {
    if (options_.sliding[g] && options_.group_pools[g] == pool) {
      return options_.max_chunk_tokens / options_.block_size;
    }
  }
  return 0;
}

const char* KvBlockAllocator::pool_name(int pool) const {
  bool full = false, sliding = false;
  for (size_t g = 0; g < options_.sliding.size(); ++g) {
    if (options_.group_pools[g] != pool) continue;
    (options_.sliding[g] ? sliding : full) = true;
  }
  if (full && sliding) return "shared";
  return sliding ? "sliding-window" : "full-attention";
}

int64_t KvBlockAllocator::num_blocks() const { return options_.num_blocks; }

std::vector<int64_t> KvBlockAllocator::PoolBlocksForLength(int64_t length) const {
  const int64_t bs = options_.block_size;
  const int64_t all = (length + bs - 1) / bs;
  const int64_t bound = SlidingBound();
  std::vector<int64_t> blocks(num_pools(), 0);
  for (size_t g = 0; g < options_.sliding.size(); ++g) {
    blocks[options_.group_pools[g]] += options_.sliding[g] ? std::min(all, bound) : all;
  }
  return blocks;
}

int64_t KvBlockAllocator::BlocksForLength(int64_t length) const {
  int64_t total = 0;
  for (int64_t n : PoolBlocksForLength(length)) total += n;
  return total;
}

int64_t KvBlockAllocator::MaxTokens() const {
  // PoolBlocksForLength is monotone: binary search the largest length that
  // fits every pool.
  auto fits = [&](int64_t length) {
    const std::vector<int64_t> need = PoolBlocksForLength(length);
    for (int p = 0; p < num_pools(); ++p) {
      if (need[p] > admission_blocks(p)) return false;
    }
    return true;
  };
  int64_t lo = 0, hi = options_.num_blocks * options_.block_size + 1;
  while (lo + 1 < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (fits(mid)) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}

absl::StatusOr<std::vector<int64_t>> KvBlockAllocator::BlocksNeeded(SequenceId seq,
                                                                    int64_t n) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return absl::NotFoundError(absl::StrCat("kv cache: no sequence ", seq));
  const Sequence& s = it->second;
  const int64_t bs = options_.block_size;
  std::vector<int64_t> needed(num_pools(), 0);
  for (size_t g = 0; g < s.tables.size(); ++g) {
    int64_t begin, end;
    WriteRange(static_cast<int>(g), s.length, n, &begin, &end);
    if (begin >= end) continue;
    const int pool = pool_of_group(static_cast<int>(g));
    const auto& table = s.tables[g];
    for (int64_t b = begin / bs; b <= (end - 1) / bs; ++b) {
      if (b >= static_cast<int64_t>(table.size()) || table[b] < 0 ||
          blocks_->refcount(table[b], pool) > 1) {
        ++needed[pool];
      }
    }
  }
  return needed;
}

absl::Status KvBlockAllocator::CheckFree(const std::vector<int64_t>& needed,
                                         absl::string_view what) const {
  for (int p = 0; p < num_pools(); ++p) {
    if (needed[p] > free_blocks(p)) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "kv cache: out of blocks: ", what, " needs ", needed[p], " more ", pool_name(p),
          " blocks but only ", free_blocks(p), " of ", pool_blocks(p), " are free"));
    }
  }
  return absl::OkStatus();
}

absl::Status KvBlockAllocator::Reserve(SequenceId seq, int64_t n, CopyBlock copy) {
  if (n < 0) return absl::InvalidArgumentError("kv cache: negative reservation");
  absl::StatusOr<std::vector<int64_t>> needed = BlocksNeeded(seq, n);
  if (!needed.ok()) return needed.status();
  FLOTILLA_RETURN_IF_ERROR(CheckFree(*needed, absl::StrCat("sequence ", seq, " (", n, " tokens)")));
  Sequence& s = seqs_[seq];
  const int64_t bs = options_.block_size;
  for (size_t g = 0; g < s.tables.size(); ++g) {
    int64_t begin, end;
    WriteRange(static_cast<int>(g), s.length, n, &begin, &end);
    if (begin >= end) continue;
    const int pool = pool_of_group(static_cast<int>(g));
    auto& table = s.tables[g];
    if (static_cast<int64_t>(table.size()) <= (end - 1) / bs) table.resize((end - 1) / bs + 1, -1);
    for (int64_t b = begin / bs; b <= (end - 1) / bs; ++b) {
      if (table[b] < 0) {
        table[b] = *blocks_->Allocate(pool);  // checked against free_blocks(pool) above
      } else if (blocks_->refcount(table[b], pool) > 1) {
        // Copy on write: this sequence gets its own copy of the shared block.
        const int32_t fresh = *blocks_->Allocate(pool);
        copy(static_cast<int>(g), table[b], fresh);
        blocks_->Release(table[b], pool);
        table[b] = fresh;
      }
    }
  }
  return absl::OkStatus();
}

absl::Status KvBlockAllocator::Commit(SequenceId seq, int64_t n, const int32_t* tokens) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return absl::NotFoundError(absl::StrCat("kv cache: no sequence ", seq));
  Sequence& s = it->second;
  s.length += n;
  if (tokens == nullptr) {
    s.chain.broken = true;
  } else {
    blocks_->Extend(&s.chain, absl::MakeConstSpan(tokens, n),
                    [&](int64_t block, std::vector<int32_t>* slots) {
                      for (size_t g = 0; g < s.tables.size(); ++g) {
                        if (block < static_cast<int64_t>(s.tables[g].size())) {
                          (*slots)[g] = s.tables[g][block];
                        }
                      }
                    });
  }
  const int64_t bs = options_.block_size;
  for (size_t g = 0; g < s.tables.size(); ++g) {
    if (!options_.sliding[g]) continue;
    auto& table = s.tables[g];
    const int64_t dead =
        std::min<int64_t>(KeepBegin(static_cast<int>(g), s.length) / bs, table.size());
    // From where the last commit stopped: a chunk longer than the window
    // leaves a gap of never-allocated blocks above the old window's.
    for (int64_t b = std::min(s.released_blocks, dead); b < dead; ++b) {
      if (table[b] < 0) continue;
      const int pool = pool_of_group(static_cast<int>(g));
      NoteLeft(s, g, b, table[b], blocks_->cached_key(table[b], pool));
      blocks_->Release(table[b], pool);
      table[b] = -1;
    }
  }
  s.released_blocks = std::max(s.released_blocks, KeepBegin(SlidingGroup(), s.length) / bs);
  return absl::OkStatus();
}

std::vector<KvBlockAllocator::BlockSource> KvBlockAllocator::Sources(
    absl::Span<const int32_t> tokens, int64_t max_blocks, uint64_t domain) const {
  std::vector<BlockSource> sources;
  if (!options_.prefix_cache) return sources;
  const PrefixCache::Link root = PrefixCache::Root(domain);
  const std::vector<PrefixCache::Hit> hits = blocks_->Walk(tokens, max_blocks, root);
  const size_t groups = options_.sliding.size();
  const int64_t bs = options_.block_size;
  max_blocks = std::min<int64_t>(max_blocks, static_cast<int64_t>(tokens.size()) / bs);
  uint64_t parent_key = root.key;
  for (int64_t b = 0; b < max_blocks; ++b) {
    absl::Span<const int32_t> block = tokens.subspan(b * bs, bs);
    BlockSource src;
    src.parent_key = parent_key;
    src.key = blocks_->BlockKey(parent_key, block);
    src.slots.assign(groups, -1);
    src.host.assign(groups, false);
    if (b < static_cast<int64_t>(hits.size())) {
      src.slots = hits[b].slots;
      src.link = hits[b].link;
    }
    bool any = false;
    for (size_t g = 0; g < groups; ++g) {
      if (src.slots[g] < 0 && options_.host_tier != nullptr) {
        src.host[g] = options_.host_tier->Contains(src.key, static_cast<int>(g), parent_key, block);
      }
      any = any || Found(src, g);
    }
    if (!any) break;
    parent_key = src.key;
    sources.push_back(std::move(src));
  }
  return sources;
}

bool KvBlockAllocator::WindowCached(const std::vector<BlockSource>& sources, int64_t blocks) const {
  const int64_t bs = options_.block_size;
  const int64_t first = std::max<int64_t>(0, blocks * bs - (options_.window - 1)) / bs;
  for (int64_t b = first; b < blocks; ++b) {
    for (size_t g = 0; g < options_.sliding.size(); ++g) {
      if (options_.sliding[g] && !Found(sources[b], g)) return false;
    }
  }
  return true;
}

int64_t KvBlockAllocator::MatchPrefix(absl::Span<const int32_t> tokens, int64_t max_blocks,
                                      uint64_t domain) const {
  const std::vector<BlockSource> sources = Sources(tokens, max_blocks, domain);
  // Full groups need every block up to the match.
  int64_t full = 0;
  for (; full < static_cast<int64_t>(sources.size()); ++full) {
    bool complete = true;
    for (size_t g = 0; g < options_.sliding.size(); ++g) {
      complete = complete && (options_.sliding[g] || Found(sources[full], g));
    }
    if (!complete) break;
  }
  // Sliding groups only the window before it: the longest match that has it.
  for (int64_t blocks = full; blocks > 0; --blocks) {
    if (WindowCached(sources, blocks)) return blocks;
  }
  return 0;
}

absl::Status KvBlockAllocator::RestoreFromHost(absl::Span<const int32_t> prefix, uint64_t domain) {
  const int64_t bs = options_.block_size;
  const int64_t blocks = static_cast<int64_t>(prefix.size()) / bs;
  const std::vector<BlockSource> sources = Sources(prefix, blocks, domain);
  const size_t groups = options_.sliding.size();
  const int64_t keep = KeepBegin(SlidingGroup(), static_cast<int64_t>(prefix.size())) / bs;
  // The (block, group) pairs the sequence takes; those only the host tier
  // holds count against their pool.
  auto takes = [&](int64_t b, size_t g) { return !options_.sliding[g] || b >= keep; };
  std::vector<int64_t> needed(num_pools(), 0);
  for (int64_t b = 0; b < blocks; ++b) {
    for (size_t g = 0; g < groups; ++g) {
      if (takes(b, g) && sources[b].slots[g] < 0) ++needed[pool_of_group(static_cast<int>(g))];
    }
  }
  if (std::all_of(needed.begin(), needed.end(), [](int64_t n) { return n == 0; })) {
    return absl::OkStatus();
  }
  // The prefix's blocks in the pools are held while the others are
  // allocated, so that no allocation evicts them.
  std::vector<std::pair<int32_t, int>> held;
  for (int64_t b = 0; b < blocks; ++b) {
    for (size_t g = 0; g < groups; ++g) {
      if (!takes(b, g) || sources[b].slots[g] < 0) continue;
      const int pool = pool_of_group(static_cast<int>(g));
      blocks_->Hold(sources[b].slots[g], pool);
      held.emplace_back(sources[b].slots[g], pool);
    }
  }
  absl::Status fits = CheckFree(needed, "a prefix from the host tier");
  // Blocks the allocations below evict are not kept: they would take the
  // slots being read.
  options_.host_tier->Freeze(true);
  if (fits.ok()) {
    std::vector<std::vector<int32_t>> slots(blocks, std::vector<int32_t>(groups, -1));
    for (int64_t b = 0; b < blocks && fits.ok(); ++b) {
      absl::Span<const int32_t> block = prefix.subspan(b * bs, bs);
      for (size_t g = 0; g < groups; ++g) {
        // Only blocks held here are registered. One the sequence does not
        // take (a sliding group's, before the window) is not held: an
        // allocation below may have evicted it and handed it out again, and
        // registering its id would give this token block another's KV.
        if (!takes(b, g)) continue;
        if (sources[b].slots[g] >= 0) {
          slots[b][g] = sources[b].slots[g];
          continue;
        }
        const int pool = pool_of_group(static_cast<int>(g));
        const int32_t fresh = *blocks_->Allocate(pool);  // CheckFree counted it
        held.emplace_back(fresh, pool);
        const uint8_t* data = options_.host_tier->Load(sources[b].key, static_cast<int>(g),
                                                       sources[b].parent_key, block);
        if (data == nullptr) {
          fits = absl::InternalError("kv cache: a host tier block went while restoring");
          break;
        }
        options_.mover->ToDevice(static_cast<int>(g), fresh, data);
        slots[b][g] = fresh;
      }
    }
    // Registered as a sequence registers the blocks it completes; then only
    // the cache keeps them until the new sequence takes them.
    PrefixCache::Chain chain;
    chain.link = PrefixCache::Root(domain);
    if (fits.ok()) {
      blocks_->Extend(&chain, prefix,
                      [&](int64_t b, std::vector<int32_t>* out) { *out = slots[b]; });
    }
  }
  options_.host_tier->Freeze(false);
  for (const auto& [block, pool] : held) blocks_->Release(block, pool);
  return fits;
}

absl::StatusOr<KvBlockAllocator::SequenceId> KvBlockAllocator::CreateSequenceFromPrefix(
    absl::Span<const int32_t> prefix, uint64_t domain) {
  const int64_t bs = options_.block_size;
  const int64_t blocks = static_cast<int64_t>(prefix.size()) / bs;
  if (static_cast<int64_t>(prefix.size()) % bs != 0 ||
      MatchPrefix(prefix, blocks, domain) != blocks) {
    return absl::FailedPreconditionError(absl::StrCat(
        "kv cache: the prefix of ", prefix.size(), " tokens is not whole cached blocks"));
  }
  FLOTILLA_RETURN_IF_ERROR(RestoreFromHost(prefix, domain));
  std::vector<PrefixCache::Hit> hits = blocks_->Walk(prefix, blocks, PrefixCache::Root(domain));
  const int64_t keep_sliding = KeepBegin(SlidingGroup(), static_cast<int64_t>(prefix.size())) / bs;
  // The first (block, group) the sequence takes that the cache lacks: the
  // host tier's blocks could not all be registered (another block held
  // under one of their keys).
  for (int64_t b = 0; b < blocks; ++b) {
    for (size_t g = 0; g < options_.sliding.size(); ++g) {
      const bool taken = !options_.sliding[g] || b >= keep_sliding;
      if (taken && (b >= static_cast<int64_t>(hits.size()) || hits[b].slots[g] < 0)) {
        return absl::FailedPreconditionError(absl::StrCat(
            "kv cache: the prefix of ", prefix.size(),
            " tokens could not be taken from the cache (token block ", b, " of ", blocks,
            ", group ", g, " (", options_.sliding[g] ? "sliding-window" : "full-attention",
            "), is not cached after the restore)"));
      }
    }
  }
  const SequenceId id = CreateSequence();
  Sequence& s = seqs_[id];
  s.length = static_cast<int64_t>(prefix.size());
  for (size_t g = 0; g < s.tables.size(); ++g) {
    auto& table = s.tables[g];
    table.assign(blocks, -1);
    const int64_t keep = KeepBegin(static_cast<int>(g), s.length) / bs;
    // The cached blocks before the window are not taken, but they belong
    // to this sequence's prefix as much as those of a sequence that
    // computed it: Free refreshes them.
    for (int64_t b = 0; b < keep; ++b) {
      if (hits[b].slots[g] >= 0) NoteLeft(s, g, b, hits[b].slots[g], hits[b].link.key);
    }
    for (int64_t b = keep; b < blocks; ++b) {
      table[b] = hits[b].slots[g];
      blocks_->Hold(table[b], pool_of_group(static_cast<int>(g)));
    }
  }
  s.released_blocks = KeepBegin(SlidingGroup(), s.length) / bs;
  s.chain.link = blocks > 0 ? hits.back().link : PrefixCache::Root(domain);
  s.chain.blocks = blocks;
  return id;
}

KvEventBatch KvBlockAllocator::TakeEvents(size_t max_keys) {
  KvEventBatch batch = blocks_->TakeEvents(max_keys);
  batch.block_size = options_.block_size;
  const bool any_sliding =
      std::find(options_.sliding.begin(), options_.sliding.end(), true) != options_.sliding.end();
  batch.sliding_window = any_sliding ? options_.window : 0;
  return batch;
}

const std::vector<int32_t>& KvBlockAllocator::Table(SequenceId seq, int group) const {
  static const std::vector<int32_t> kNone;
  auto it = seqs_.find(seq);
  return it == seqs_.end() ? kNone : it->second.tables[group];
}

int64_t KvBlockAllocator::BlocksHeld(SequenceId seq, int group) const {
  const auto& t = Table(seq, group);
  return std::count_if(t.begin(), t.end(), [](int32_t b) { return b >= 0; });
}

}  // namespace flotilla
