#include "worker/engine/step_layout.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace flotilla {
namespace {

// The tokens every item brings when a graph can run the step: 1 for a
// decode step, q > 1 when every item is a drafted chunk of q tokens verified
// at all its positions (not on a sharded rank, whose peers pad one-token
// steps only); 0 when the items differ.
int UniformChunk(const std::vector<StepItem>& items, const std::vector<LogitsMode>& modes,
                 const StepLayoutOptions& options) {
  if (items.empty()) return options.sharded ? 1 : 0;
  const size_t q = items[0].tokens.size();
  for (size_t i = 0; i < items.size(); ++i) {
    if (items[i].tokens.size() != q) return 0;
    const bool verified =
        items[i].draft_tokens + 1 == static_cast<int64_t>(q) && modes[i] == LogitsMode::kLast;
    if (q > 1 && (!verified || options.sharded)) return 0;
  }
  return static_cast<int>(q);
}

// Whether the step is padded into a graph's batch (see StepLayout::Plan).
void ChoosePadding(const std::vector<StepItem>& items, const std::vector<LogitsMode>& modes,
                   bool sampling, const StepLayoutOptions& options, StepLayout* layout) {
  const int q = UniformChunk(items, modes, options);
  bool rows_fit = true, any_row = false;
  for (size_t i = 0; i < items.size(); ++i) {
    const bool row = modes[i] == LogitsMode::kLast;
    const bool none = !sampling && modes[i] == LogitsMode::kNone;
    rows_fit = rows_fit && (row || (options.sharded && none));
    any_row = any_row || row;
  }
  const int64_t seqs = std::min<int64_t>(PowerOfTwoAtLeast(std::max<size_t>(items.size(), 1)),
                                         options.max_sequences);
  // A padded verify step computes a logit row for every token.
  const bool fits =
      q == 1 || (seqs * q <= options.max_logit_rows && seqs * q <= options.max_tokens);
  layout->padded = options.graphs && q > 0 && fits && (rows_fit || options.sharded);
  layout->decode = layout->padded && rows_fit;
  layout->pad_rows = sampling || any_row;
  layout->real_items = static_cast<int>(items.size());
  layout->chunk = layout->padded ? q : 0;
  layout->seqs = layout->padded ? static_cast<int>(seqs) : static_cast<int>(items.size());
}

int32_t* TableOf(const StepMetaOffsets& o, int32_t* meta, int group, int sequence) {
  return meta + o.tables + group * o.tables_stride +
         static_cast<size_t>(sequence) * o.max_blocks_per_seq;
}

// Item `i`'s rows starting at row T: tokens, positions, slots, tables, length.
absl::Status LayOutItem(const StepItem& item, int i, int T, const KvBlockAllocator& kv,
                        const StepMetaOffsets& o, int block_size, int32_t* meta) {
  const absl::StatusOr<int64_t> length = kv.Length(item.sequence);
  if (!length.ok()) return length.status();
  const int n = static_cast<int>(item.tokens.size());
  for (int j = 0; j < n; ++j) {
    meta[o.tokens + T + j] = item.tokens[j];
    meta[o.pos + T + j] = static_cast<int32_t>(*length + j);
  }
  for (int g = 0; g < o.kv_groups; ++g) {
    const std::vector<int32_t>& blocks = kv.Table(item.sequence, g);
    int32_t* slots = meta + o.slots + g * o.slots_stride + T;
    for (int j = 0; j < n; ++j) {
      const int64_t p = *length + j;
      slots[j] = blocks[p / block_size] * block_size + static_cast<int32_t>(p % block_size);
    }
    // Blocks a sliding group dropped read as the scratch block: the kernels
    // never read a position before the window.
    int32_t* table = TableOf(o, meta, g, i);
    for (size_t b = 0; b < blocks.size(); ++b) table[b] = std::max(blocks[b], 0);
    std::fill(table + blocks.size(), table + o.max_blocks_per_seq, 0);
  }
  meta[o.lens + i] = static_cast<int32_t>(*length + n);
  return absl::OkStatus();
}

// Padding sequence `i` from row T: `q` tokens at positions 0.. of a
// sequence in the scratch block; their K/V are not stored and their outputs
// are dropped.
void LayOutPadding(int i, int T, int q, const StepMetaOffsets& o, int32_t* meta) {
  for (int j = 0; j < q; ++j) {
    meta[o.tokens + T + j] = 0;
    meta[o.pos + T + j] = j;
  }
  for (int g = 0; g < o.kv_groups; ++g) {
    std::fill_n(meta + o.slots + g * o.slots_stride + T, q, -1);
    int32_t* table = TableOf(o, meta, g, i);
    std::fill(table, table + o.max_blocks_per_seq, 0);
  }
  meta[o.lens + i] = q;
}

}  // namespace

StepMetaOffsets StepMetaOffsets::For(int max_tokens, int max_seqs, int logit_rows, int kv_groups,
                                     int64_t max_blocks_per_seq) {
  StepMetaOffsets o;
  o.kv_groups = kv_groups;
  o.max_blocks_per_seq = static_cast<int>(max_blocks_per_seq);
  o.tokens = 0;
  o.pos = o.tokens + max_tokens;
  o.slots = o.pos + max_tokens;
  o.slots_stride = max_tokens;
  o.qstart = o.slots + kv_groups * o.slots_stride;
  o.lens = o.qstart + max_seqs + 1;
  o.rows = o.lens + max_seqs;
  o.tables = o.rows + std::max(max_tokens, logit_rows);
  o.tables_stride = static_cast<size_t>(max_seqs) * max_blocks_per_seq;
  o.total = o.tables + kv_groups * o.tables_stride;
  return o;
}

absl::StatusOr<StepLayout> StepLayout::Plan(const std::vector<StepItem>& items,
                                            const std::vector<LogitsMode>& modes, bool sampling,
                                            const KvBlockAllocator& kv,
                                            const StepMetaOffsets& offsets,
                                            const StepLayoutOptions& options, int32_t* meta) {
  if (modes.size() != items.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("step layout: ", modes.size(), " logits modes for ", items.size(), " items"));
  }
  StepLayout layout;
  ChoosePadding(items, modes, sampling, options, &layout);
  std::vector<int> rows;
  int T = 0;
  for (int i = 0; i < layout.seqs; ++i) {
    meta[offsets.qstart + i] = T;
    if (i >= layout.real_items) {
      const int q = std::max(layout.chunk, 1);
      LayOutPadding(i, T, q, offsets, meta);
      for (int j = 0; j < q && layout.pad_rows; ++j) rows.push_back(T + j);
      layout.max_q = std::max(layout.max_q, q);
      T += q;
      continue;
    }
    const StepItem& item = items[i];
    FLOTILLA_RETURN_IF_ERROR(LayOutItem(item, i, T, kv, offsets, options.block_size, meta));
    const int n = static_cast<int>(item.tokens.size());
    layout.first_row.push_back(static_cast<int>(rows.size()));
    if (modes[i] == LogitsMode::kAll) {
      for (int j = 0; j < n; ++j) rows.push_back(T + j);
    } else if (modes[i] == LogitsMode::kLast) {
      // A drafted chunk: the rows its drafted tokens are verified from.
      for (int j = n - 1 - item.draft_tokens; j < n; ++j) rows.push_back(T + j);
    }
    layout.row_count.push_back(static_cast<int>(rows.size()) - layout.first_row.back());
    layout.max_q = std::max(layout.max_q, n);
    layout.max_len = std::max<int64_t>(layout.max_len, meta[offsets.lens + i]);
    T += n;
  }
  meta[offsets.qstart + layout.seqs] = T;
  layout.tokens = T;
  layout.rows = static_cast<int>(rows.size());
  std::copy(rows.begin(), rows.end(), meta + offsets.rows);
  return layout;
}

std::vector<std::pair<size_t, size_t>> StepLayout::UsedRegions(const StepMetaOffsets& o) const {
  std::vector<std::pair<size_t, size_t>> regions;
  regions.emplace_back(o.tokens, tokens);
  regions.emplace_back(o.pos, tokens);
  for (int g = 0; g < o.kv_groups; ++g) {
    regions.emplace_back(o.slots + g * o.slots_stride, tokens);
    regions.emplace_back(o.tables + g * o.tables_stride,
                         static_cast<size_t>(seqs) * o.max_blocks_per_seq);
  }
  regions.emplace_back(o.qstart, seqs + 1);
  regions.emplace_back(o.lens, seqs);
  regions.emplace_back(o.rows, std::max(rows, 1));
  return regions;
}

int64_t PowerOfTwoAtLeast(int64_t n) {
  int64_t p = 1;
  while (p < n) p <<= 1;
  return p;
}

int64_t DecodeContextBucket(int64_t max_len, int64_t max_context) {
  return std::min<int64_t>(std::max<int64_t>(PowerOfTwoAtLeast(max_len), 1024), max_context);
}

absl::StatusOr<int64_t> ShardedStepBound(int64_t instance_step_tokens, int tokens,
                                         int64_t max_batch_tokens) {
  const int64_t n = std::max<int64_t>(instance_step_tokens > 0 ? instance_step_tokens : tokens, 1);
  const int64_t bound = std::min<int64_t>(PowerOfTwoAtLeast(n), max_batch_tokens);
  if (bound < tokens) {
    return absl::InternalError(absl::StrCat(
        "step: ", tokens, " tokens on this rank, more than the ", "instance's step bound ", bound));
  }
  return bound;
}

}  // namespace flotilla
