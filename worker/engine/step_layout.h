// What a CudaEngine step computes on the host before it launches anything:
// the rows of the step (tokens, positions, per-sequence query starts and
// lengths), each KV group's slot per new position and block table per
// sequence, the positions whose logits are computed, and the padding of
// one-token steps to a power-of-two batch so a captured CUDA graph can
// replay them. Pure host code over a KvBlockAllocator (tested on the CPU).
//
// The result is written into one int32 region at fixed offsets
// (StepMetaOffsets), the pinned mirror of the device's metadata buffer:
// graphs keep the device addresses, so only the contents change per step.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/engine/engine.h"
#include "worker/engine/kv_block_allocator.h"

namespace flotilla {

// Offsets (in int32 elements) of the regions of the step metadata buffer,
// sized for the largest step. Slots and block tables come once per KV group,
// `slots_stride` / `tables_stride` apart.
struct StepMetaOffsets {
  size_t tokens = 0;  // [max_tokens] token ids
  size_t pos = 0;     // [max_tokens] positions
  size_t slots = 0;   // [kv_groups][max_tokens] KV slot of each new position (-1: not stored)
  size_t qstart = 0;  // [max_seqs + 1] first row of each sequence, then the total
  size_t lens = 0;    // [max_seqs] sequence lengths after the step
  size_t rows = 0;    // [max(max_tokens, logit_rows)] the rows whose logits are computed
  size_t tables = 0;  // [kv_groups][max_seqs][max_blocks_per_seq] block tables
  size_t slots_stride = 0, tables_stride = 0;
  size_t total = 0;  // ints in the buffer
  int kv_groups = 1;
  int max_blocks_per_seq = 0;

  static StepMetaOffsets For(int max_tokens, int max_seqs, int logit_rows, int kv_groups,
                             int64_t max_blocks_per_seq);
};

struct StepLayoutOptions {
  int max_sequences = 256;  // padded batches never exceed it
  int block_size = 16;
  bool graphs = true;    // decode and uniform verify steps may be padded for a CUDA graph
  bool sharded = false;  // a rank of a sharded instance (see StepLayout::Plan)
  // What a padded verify step may fill: its logit rows and its tokens.
  int max_logit_rows = 256;
  int max_tokens = 8192;
};

// One step's host-side layout.
struct StepLayout {
  int tokens = 0;                         // T, padded rows included
  int seqs = 0;                           // B, padded rows included
  int real_items = 0;                     // items of the caller
  int rows = 0;                           // logit rows
  int max_q = 0;                          // most tokens of one sequence
  int chunk = 0;                          // padded: the tokens of every sequence (else 0)
  int64_t max_len = 1;                    // longest sequence after the step
  std::vector<int> first_row, row_count;  // per real item: its logit rows
  // Padded to `seqs` sequences for a graph; `decode`: replayed as a graph
  // (every row fits it); `pad_rows`: padding rows get logit rows too.
  bool padded = false, decode = false, pad_rows = false;
  // The logit rows come from the tensor-parallel group (StepItem::
  // group_logits; set by the engine, not by Plan).
  bool group_logits = false;

  // Lays out `items` (their tables already reserved in `kv` for the step's
  // tokens) into `meta` (offsets.total ints). `modes[i]`: the logits item i
  // computes (kLast: its last draft_tokens + 1 positions, one row without a
  // draft); with `sampling` every item is kLast (the rows it samples from)
  // or kNone. Decode steps (one token per item) are padded to a power of
  // two with one-token rows at position 0 whose K/V are not stored (slot -1)
  // and whose tables point at the scratch block 0; so are verify steps whose
  // items are all drafted chunks of the same q tokens (kLast; padding
  // sequences of q tokens, a logit row each, while they fit
  // max_logit_rows and max_tokens). A sharded rank pads every
  // one-token-per-item step (TP peers must run the same padded tokens
  // whatever logits each asks for) and an empty step to one padding row.
  // INVALID_ARGUMENT when an item's sequence is unknown or the modes do not
  // match the items.
  static absl::StatusOr<StepLayout> Plan(const std::vector<StepItem>& items,
                                         const std::vector<LogitsMode>& modes, bool sampling,
                                         const KvBlockAllocator& kv, const StepMetaOffsets& offsets,
                                         const StepLayoutOptions& options, int32_t* meta);

  // The used part of each metadata region as (offset, ints), in upload order.
  std::vector<std::pair<size_t, size_t>> UsedRegions(const StepMetaOffsets& offsets) const;
};

// Next power of two >= n (n >= 1).
int64_t PowerOfTwoAtLeast(int64_t n);

// The context bucket a decode graph is captured for: the longest sequence
// rounded up to a power of two, at least 1024, at most `max_context`.
int64_t DecodeContextBucket(int64_t max_len, int64_t max_context);

// A sharded step's token bound, the same on every rank: the instance's
// largest step (`instance_step_tokens`, 0: this rank's `tokens`) rounded up
// as decode batches are, at most `max_batch_tokens`. INTERNAL when this
// rank's tokens exceed it.
absl::StatusOr<int64_t> ShardedStepBound(int64_t instance_step_tokens, int tokens,
                                         int64_t max_batch_tokens);

}  // namespace flotilla
