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
  if (o.host_cache_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv cache: host_cache_bytes must not be negative, got ", o.host_cache_bytes));
  }
  std::unique_ptr<KvCache> cache(new KvCache(o));
  KvBlockAllocatorOptions ao;
  ao.sliding = o.sliding;  // one group per layer
  ao.window = o.window;
  ao.block_size = o.block_size;
  ao.num_blocks = o.num_blocks;
  ao.prefix_cache = o.prefix_cache;
  if (cache->host_tier_ != nullptr) {
    ao.host_tier = cache->host_tier_.get();
    ao.mover = cache.get();
  }
  absl::StatusOr<std::unique_ptr<KvBlockAllocator>> blocks = KvBlockAllocator::Create(ao);
  if (!blocks.ok()) return blocks.status();
  cache->blocks_ = std::move(*blocks);
  return cache;
}

KvCache::KvCache(const KvCacheOptions& o)
    : options_(o),
      block_floats_(2 * o.block_size * o.kv_heads * o.head_dim),
      arena_(static_cast<size_t>(block_floats_ * std::max<int64_t>(0, o.num_blocks))) {
  const size_t slot = block_floats_ * sizeof(float);
  const int64_t slots = o.prefix_cache ? o.host_cache_bytes / static_cast<int64_t>(slot) : 0;
  if (slots > 0) {
    host_arena_.resize(static_cast<size_t>(slots) * slot);
    host_tier_ = std::make_unique<KvHostTier>(host_arena_.data(), slot, slots);
  }
}

void KvCache::ToHost(int /*layer*/, int32_t block, uint8_t* host) {
  std::memcpy(host, &arena_[block * block_floats_], block_floats_ * sizeof(float));
}

void KvCache::ToDevice(int /*layer*/, int32_t block, const uint8_t* host) {
  std::memcpy(&arena_[block * block_floats_], host, block_floats_ * sizeof(float));
}

KvCache::SequenceId KvCache::CreateSequence() { return blocks_->CreateSequence(); }

absl::StatusOr<KvCache::SequenceId> KvCache::Fork(SequenceId source) {
  return blocks_->Fork(source);
}

absl::Status KvCache::Free(SequenceId seq) { return blocks_->Free(seq); }

absl::StatusOr<int64_t> KvCache::Length(SequenceId seq) const { return blocks_->Length(seq); }

int64_t KvCache::MatchPrefix(absl::Span<const int32_t> tokens, int64_t max_blocks,
                             uint64_t domain) const {
  return blocks_->MatchPrefix(tokens, max_blocks, domain);
}

absl::StatusOr<KvCache::SequenceId> KvCache::CreateSequenceFromPrefix(
    absl::Span<const int32_t> prefix, uint64_t domain) {
  return blocks_->CreateSequenceFromPrefix(prefix, domain);
}

int64_t KvCache::BlocksForLength(int64_t length) const { return blocks_->BlocksForLength(length); }

int64_t KvCache::MaxTokens() const { return blocks_->MaxTokens(); }

absl::StatusOr<int64_t> KvCache::BlocksNeeded(SequenceId seq, int64_t n) const {
  absl::StatusOr<std::vector<int64_t>> needed = blocks_->BlocksNeeded(seq, n);
  if (!needed.ok()) return needed.status();
  return (*needed)[0];  // one pool: every layer's blocks
}

absl::Status KvCache::Reserve(SequenceId seq, int64_t n) {
  return blocks_->Reserve(seq, n, [&](int /*layer*/, int32_t from, int32_t to) {
    std::memcpy(&arena_[to * block_floats_], &arena_[from * block_floats_],
                block_floats_ * sizeof(float));
  });
}

float* KvCache::Row(SequenceId seq, int layer, int64_t pos, bool value) {
  absl::StatusOr<int64_t> length = blocks_->Length(seq);
  if (!length.ok()) return nullptr;
  const auto& table = blocks_->Table(seq, layer);
  const int64_t b = pos / options_.block_size;
  if (b >= static_cast<int64_t>(table.size()) || table[b] < 0) return nullptr;
  if (!blocks_->Keeps(layer, *length, pos)) return nullptr;
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

absl::Status KvCache::Commit(SequenceId seq, int64_t n) { return blocks_->Commit(seq, n, nullptr); }

absl::Status KvCache::Commit(SequenceId seq, absl::Span<const int32_t> tokens) {
  return blocks_->Commit(seq, static_cast<int64_t>(tokens.size()), tokens.data());
}

kernels::cpu::KvCacheView KvCache::View(SequenceId seq, int layer) const {
  kernels::cpu::KvCacheView v;
  absl::StatusOr<int64_t> length = blocks_->Length(seq);
  if (!length.ok()) return v;
  v.arena = arena_.data();
  v.block_table = blocks_->Table(seq, layer).data();
  v.block_size = options_.block_size;
  v.block_floats = block_floats_;
  v.end = *length;
  v.begin = blocks_->KeepBegin(layer, v.end);
  return v;
}

}  // namespace flotilla
