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
  return std::unique_ptr<KvCache>(new KvCache(o));
}

KvCache::KvCache(const KvCacheOptions& o)
    : options_(o),
      block_floats_(2 * o.block_size * o.kv_heads * o.head_dim),
      arena_(static_cast<size_t>(block_floats_ * o.num_blocks)),
      refcount_(o.num_blocks, 0) {
  free_list_.reserve(o.num_blocks);
  // Hand out low block numbers first.
  for (int64_t b = o.num_blocks - 1; b >= 0; --b) free_list_.push_back(static_cast<int32_t>(b));
}

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
      if (b >= 0) ++refcount_[b];
    }
  }
  seqs_.emplace(id, std::move(copy));
  return id;
}

absl::Status KvCache::Free(SequenceId seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return absl::NotFoundError(absl::StrCat("kv cache: no sequence ", seq));
  for (const auto& table : it->second.tables) {
    for (int32_t b : table) {
      if (b >= 0) Release(b);
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

int64_t KvCache::KeepBegin(int layer, int64_t length) const {
  if (!options_.sliding[layer]) return 0;
  return std::max<int64_t>(0, length - (options_.window - 1));
}

void KvCache::WriteRange(int layer, int64_t length, int64_t n, int64_t* begin,
                         int64_t* end) const {
  *end = length + n;
  *begin = std::max(length, KeepBegin(layer, length + n));
}

int64_t KvCache::BlocksForLength(int64_t length) const {
  const int64_t bs = options_.block_size;
  int64_t total = 0;
  for (size_t l = 0; l < options_.sliding.size(); ++l) {
    if (options_.sliding[l]) {
      // During a step the window - 1 kept positions and up to window - 1 new
      // ones are held together; the new ones may straddle one more block.
      total += std::min((length + bs - 1) / bs, (2 * options_.window + bs - 1) / bs + 1);
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
      if (b >= static_cast<int64_t>(table.size()) || table[b] < 0 || refcount_[table[b]] > 1) {
        ++needed;
      }
    }
  }
  return needed;
}

int32_t KvCache::Allocate() {
  int32_t b = free_list_.back();
  free_list_.pop_back();
  refcount_[b] = 1;
  return b;
}

void KvCache::Release(int32_t block) {
  if (--refcount_[block] == 0) free_list_.push_back(block);
}

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
      } else if (refcount_[table[b]] > 1) {
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

absl::Status KvCache::Commit(SequenceId seq, int64_t n) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return absl::NotFoundError(absl::StrCat("kv cache: no sequence ", seq));
  Sequence& s = it->second;
  s.length += n;
  const int64_t bs = options_.block_size;
  for (size_t l = 0; l < s.tables.size(); ++l) {
    if (!options_.sliding[l]) continue;
    const int64_t keep = KeepBegin(static_cast<int>(l), s.length);
    auto& table = s.tables[l];
    const int64_t dead = std::min<int64_t>(keep / bs, table.size());
    for (int64_t b = dead - 1; b >= 0 && table[b] >= 0; --b) {
      Release(table[b]);
      table[b] = -1;
    }
  }
  return absl::OkStatus();
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
