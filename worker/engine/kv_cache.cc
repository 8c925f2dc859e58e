#include "worker/engine/kv_cache.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace flotilla {

absl::StatusOr<std::unique_ptr<KvCache>> KvCache::Create(const KvCacheOptions& o) {
  if (o.sliding.empty()) return absl::InvalidArgumentError("kv cache: no layers");
  if (o.kv_heads <= 0 || o.head_dim <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("kv cache: kv_heads ", o.kv_heads,
                                                   " and head_dim ", o.head_dim,
                                                   " must be positive"));
  }
  if (o.block_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv cache: block_size must be positive, got ", o.block_size));
  }
  if (o.num_blocks <= 0 || o.num_blocks > INT32_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv cache: num_blocks must be in [1, 2^31), got ", o.num_blocks));
  }
  bool any_sliding = std::find(o.sliding.begin(), o.sliding.end(), true) != o.sliding.end();
  if (any_sliding && o.window <= 0) {
    return absl::InvalidArgumentError("kv cache: sliding layers need a positive window");
  }
  PrefixCacheOptions po;
  po.block_size = o.block_size;
  po.num_blocks = static_cast<int32_t>(o.num_blocks);
  po.slots = static_cast<int>(o.sliding.size());
  po.enabled = o.prefix_cache;
  absl::StatusOr<std::unique_ptr<PrefixCache>> blocks = PrefixCache::Create(po);
  if (!blocks.ok()) return blocks.status();
  return std::unique_ptr<KvCache>(new KvCache(o, std::move(*blocks)));
}

KvCache::KvCache(const KvCacheOptions& o, std::unique_ptr<PrefixCache> blocks)
    : options_(o),
      block_floats_(2 * o.block_size * o.kv_heads * o.head_dim),
      arena_(static_cast<size_t>(block_floats_ * o.num_blocks)),
      blocks_(std::move(blocks)) {}

KvCache::SequenceId KvCache::CreateSequence() {
  SequenceId id = next_id_++;
  Sequence& s = seqs_[id];
  s.tables.resize(options_.sliding.size());
  return id;
}

absl::StatusOr<KvCache::SequenceId> KvCache::Fork(SequenceId source) {
  auto it = seqs_.find(source);
  if (it == seqs_.end()) {
    return absl::NotFoundError(absl::StrCat("kv cache: no sequence ", source));
  }
  SequenceId id = next_id_++;
  Sequence copy = it->second;
  for (const auto& table : copy.tables) {
    for (int32_t b : table) {
      if (b >= 0) blocks_->Hold(b);
    }
  }
  seqs_.emplace(id, std::move(copy));
  return id;
}

absl::Status KvCache::Free(SequenceId seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return absl::NotFoundError(absl::StrCat("kv cache: no sequence ", seq));
  // Last blocks first: a prefix's first blocks, which every longer match
  // needs, are then the most recently freed and the last evicted.
  const auto& tables = it->second.tables;
  size_t longest = 0;
  for (const auto& table : tables) longest = std::max(longest, table.size());
  for (size_t b = longest; b-- > 0;) {
    for (const auto& table : tables) {
      if (b < table.size() && table[b] >= 0) Release(table[b]);
    }
  }
  seqs_.erase(it);
  return absl::OkStatus();
}

absl::StatusOr<int64_t> KvCache::Length(SequenceId seq) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return absl::NotFoundError(absl::StrCat("kv cache: no sequence ", seq));
  return it->second.length;
}

int KvCache::SlidingLayer() const {
  auto it = std::find(options_.sliding.begin(), options_.sliding.end(), true);
  return it == options_.sliding.end() ? 0 : static_cast<int>(it - options_.sliding.begin());
}

int64_t KvCache::KeepBegin(int layer, int64_t length) const {
  if (!options_.sliding[layer]) return 0;
  return std::max<int64_t>(0, length - (options_.window - 1));
}

void KvCache::WriteRange(int layer, int64_t length, int64_t n, int64_t* begin,
                         int64_t* end) const {
  *end = length + n;
  *begin = std::max(length, KeepBegin(layer, length + n));
  if (options_.prefix_cache && options_.sliding[layer]) {
    // Whole blocks from the window before the last block boundary short of
    // the end (a prompt's match stops before its last token), so that a
    // prefix ending there finds its sliding-layer KV complete.
    const int64_t bs = options_.block_size;
    const int64_t boundary = (*end - 1) / bs * bs;
    const int64_t first = std::max<int64_t>(0, boundary - (options_.window - 1)) / bs * bs;
    *begin = std::max(length, std::min(*begin, first));
  }
}

int64_t KvCache::BlocksForLength(int64_t length) const {
  const int64_t bs = options_.block_size;
  int64_t total = 0;
  for (size_t l = 0; l < options_.sliding.size(); ++l) {
    if (options_.sliding[l]) {
      // During a step the window - 1 kept positions and up to window - 1 new
      // ones are held together; the new ones may straddle one more block.
      // With the prefix cache the new ones start up to two blocks earlier.
      const int64_t bound = options_.prefix_cache
                                ? (options_.window + bs - 2) / bs + 1 + (options_.window + 2 * bs) / bs + 2
                                : (2 * options_.window + bs - 1) / bs + 1;
      total += std::min((length + bs - 1) / bs, bound);
    } else {
      total += (length + bs - 1) / bs;
    }
  }
  return total;
}

int64_t KvCache::MaxTokens() const {
  // BlocksForLength is monotone: binary search the largest length that fits.
  int64_t lo = 0, hi = options_.num_blocks * options_.block_size + 1;
  while (lo + 1 < hi) {
    int64_t mid = lo + (hi - lo) / 2;
    if (BlocksForLength(mid) <= options_.num_blocks) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}

absl::StatusOr<int64_t> KvCache::BlocksNeeded(SequenceId seq, int64_t n) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return absl::NotFoundError(absl::StrCat("kv cache: no sequence ", seq));
  const Sequence& s = it->second;
  const int64_t bs = options_.block_size;
  int64_t needed = 0;
  for (size_t l = 0; l < s.tables.size(); ++l) {
    int64_t begin, end;
    WriteRange(static_cast<int>(l), s.length, n, &begin, &end);
    if (begin >= end) continue;
    for (int64_t b = begin / bs; b <= (end - 1) / bs; ++b) {
      const auto& table = s.tables[l];
      if (b >= static_cast<int64_t>(table.size()) || table[b] < 0 || blocks_->refcount(table[b]) > 1) {
        ++needed;
      }
    }
  }
  return needed;
}

int32_t KvCache::Allocate() {
  // Reserve checked BlocksNeeded against free_blocks() first.
  return *blocks_->Allocate();
}

void KvCache::Release(int32_t block) { blocks_->Release(block); }

absl::Status KvCache::Reserve(SequenceId seq, int64_t n) {
  if (n < 0) return absl::InvalidArgumentError("kv cache: negative reservation");
  absl::StatusOr<int64_t> needed = BlocksNeeded(seq, n);
  if (!needed.ok()) return needed.status();
  if (*needed > free_blocks()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("kv cache: out of blocks: sequence ", seq, " needs ", *needed,
                     " more blocks for ", n, " tokens but only ", free_blocks(), " of ",
                     options_.num_blocks, " are free"));
  }
  Sequence& s = seqs_[seq];
  const int64_t bs = options_.block_size;
  for (size_t l = 0; l < s.tables.size(); ++l) {
    int64_t begin, end;
    WriteRange(static_cast<int>(l), s.length, n, &begin, &end);
    if (begin >= end) continue;
    auto& table = s.tables[l];
    if (static_cast<int64_t>(table.size()) <= (end - 1) / bs) table.resize((end - 1) / bs + 1, -1);
    for (int64_t b = begin / bs; b <= (end - 1) / bs; ++b) {
      if (table[b] < 0) {
        table[b] = Allocate();
      } else if (blocks_->refcount(table[b]) > 1) {
        // Copy on write: this sequence gets its own copy of the shared block.
        int32_t fresh = Allocate();
        std::memcpy(&arena_[fresh * block_floats_], &arena_[table[b] * block_floats_],
                    block_floats_ * sizeof(float));
        Release(table[b]);
        table[b] = fresh;
      }
    }
  }
  return absl::OkStatus();
}

float* KvCache::Row(SequenceId seq, int layer, int64_t pos, bool value) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return nullptr;
  const auto& table = it->second.tables[layer];
  const int64_t b = pos / options_.block_size;
  if (b >= static_cast<int64_t>(table.size()) || table[b] < 0) return nullptr;
  if (pos < KeepBegin(layer, it->second.length) && options_.sliding[layer]) return nullptr;
  float* blk = &arena_[table[b] * block_floats_];
  if (value) blk += block_floats_ / 2;
  return blk + (pos % options_.block_size) * options_.kv_heads * options_.head_dim;
}

float* KvCache::KeyRow(SequenceId seq, int layer, int64_t pos) {
  return Row(seq, layer, pos, false);
}
float* KvCache::ValueRow(SequenceId seq, int layer, int64_t pos) {
  return Row(seq, layer, pos, true);
}

absl::Status KvCache::Commit(SequenceId seq, int64_t n) { return CommitTokens(seq, n, nullptr); }

absl::Status KvCache::Commit(SequenceId seq, absl::Span<const int32_t> tokens) {
  return CommitTokens(seq, static_cast<int64_t>(tokens.size()), tokens.data());
}

absl::Status KvCache::CommitTokens(SequenceId seq, int64_t n, const int32_t* tokens) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return absl::NotFoundError(absl::StrCat("kv cache: no sequence ", seq));
  Sequence& s = it->second;
  s.length += n;
  if (tokens == nullptr) {
    s.chain.broken = true;
  } else {
    blocks_->Extend(&s.chain, absl::MakeConstSpan(tokens, n),
                    [&](int64_t block, std::vector<int32_t>* slots) {
                      for (size_t l = 0; l < s.tables.size(); ++l) {
                        if (block < static_cast<int64_t>(s.tables[l].size())) {
                          (*slots)[l] = s.tables[l][block];
                        }
                      }
                    });
  }
  const int64_t bs = options_.block_size;
  for (size_t l = 0; l < s.tables.size(); ++l) {
    if (!options_.sliding[l]) continue;
    const int64_t keep = KeepBegin(static_cast<int>(l), s.length);
    auto& table = s.tables[l];
    const int64_t dead = std::min<int64_t>(keep / bs, table.size());
    // From where the last commit stopped: a chunk longer than the window
    // leaves a gap of never-allocated blocks above the old window's.
    for (int64_t b = std::min(s.released_blocks, dead); b < dead; ++b) {
      if (table[b] < 0) continue;
      Release(table[b]);
      table[b] = -1;
    }
  }
  s.released_blocks = std::max(s.released_blocks, KeepBegin(SlidingLayer(), s.length) / bs);
  return absl::OkStatus();
}

bool KvCache::WindowCached(const std::vector<PrefixCache::Hit>& hits, int64_t blocks) const {
  const int64_t bs = options_.block_size;
  const int64_t first = std::max<int64_t>(0, blocks * bs - (options_.window - 1)) / bs;
  for (int64_t b = first; b < blocks; ++b) {
    for (size_t l = 0; l < options_.sliding.size(); ++l) {
      if (options_.sliding[l] && hits[b].slots[l] < 0) return false;
    }
  }
  return true;
}

int64_t KvCache::MatchPrefix(absl::Span<const int32_t> tokens, int64_t max_blocks) const {
  std::vector<PrefixCache::Hit> hits = blocks_->Walk(tokens, max_blocks);
  // Full layers need every block up to the match.
  int64_t full = 0;
  for (; full < static_cast<int64_t>(hits.size()); ++full) {
    bool complete = true;
    for (size_t l = 0; l < options_.sliding.size(); ++l) {
      complete = complete && (options_.sliding[l] || hits[full].slots[l] >= 0);
    }
    if (!complete) break;
  }
  // Sliding layers only the window before it: the longest match that has it.
  for (int64_t blocks = full; blocks > 0; --blocks) {
    if (WindowCached(hits, blocks)) return blocks;
  }
  return 0;
}

absl::StatusOr<KvCache::SequenceId> KvCache::CreateSequenceFromPrefix(
    absl::Span<const int32_t> prefix) {
  const int64_t bs = options_.block_size;
  const int64_t blocks = static_cast<int64_t>(prefix.size()) / bs;
  if (static_cast<int64_t>(prefix.size()) % bs != 0 || MatchPrefix(prefix, blocks) != blocks) {
    return absl::FailedPreconditionError(absl::StrCat(
        "kv cache: the prefix of ", prefix.size(), " tokens is not whole cached blocks"));
  }
  std::vector<PrefixCache::Hit> hits = blocks_->Walk(prefix, blocks);
  const SequenceId id = CreateSequence();
  Sequence& s = seqs_[id];
  s.length = static_cast<int64_t>(prefix.size());
  for (size_t l = 0; l < s.tables.size(); ++l) {
    auto& table = s.tables[l];
    table.assign(blocks, -1);
    for (int64_t b = KeepBegin(static_cast<int>(l), s.length) / bs; b < blocks; ++b) {
      table[b] = hits[b].slots[l];
      blocks_->Hold(table[b]);
    }
  }
  s.released_blocks = KeepBegin(SlidingLayer(), s.length) / bs;
  if (blocks > 0) s.chain.link = hits.back().link;
  s.chain.blocks = blocks;
  return id;
}

kernels::cpu::KvCacheView KvCache::View(SequenceId seq, int layer) const {
  kernels::cpu::KvCacheView v;
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return v;
  v.arena = arena_.data();
  v.block_table = it->second.tables[layer].data();
  v.block_size = options_.block_size;
  v.block_floats = block_floats_;
  v.end = it->second.length;
  v.begin = KeepBegin(layer, v.end);
  return v;
}

int64_t KvCache::BlocksHeld(SequenceId seq, int layer) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return 0;
  const auto& t = it->second.tables[layer];
  return std::count_if(t.begin(), t.end(), [](int32_t b) { return b >= 0; });
}

}  // namespace flotilla
