// The tensor-parallel MoE layout's share of one expert (common/parallel_config.h):
// TP rank r of t holds the intermediate columns [begin, begin + size) of
// IntermediateSliceOf, i.e. gate_up rows [2 begin, 2 (begin + size)) (gate
// and up interleaved, so whole pairs), their biases, down's columns
// [begin, begin + size) in whole MXFP4 blocks, and down's bias on TP rank 0
// only (zeros elsewhere): the TP group's partial outputs then sum to the
// expert's output.
#pragma once

#include <cstdint>
#include <memory>

#include "common/parallel_config.h"
#include "worker/model/weights.h"

namespace flotilla {

// Where the slice lies inside an expert of the checkpoint's layout, in bytes
// and elements, for copies that read the full tensors (host or device).
struct ExpertSliceLayout {
  int64_t hidden = 0;        // H
  int64_t intermediate = 0;  // I of the full expert
  IntermediateSlice slice;
  bool down_bias = false;  // this rank adds down's bias

  // gate_up: a contiguous run of rows.
  int64_t gate_up_row_begin() const { return 2 * slice.begin; }
  int64_t gate_up_rows() const { return 2 * slice.size; }
  // down: per row of H, a run of blocks at this offset, of this many blocks.
  int64_t down_block_begin() const { return slice.begin / 32; }
  int64_t down_blocks() const { return slice.size / 32; }
  int64_t down_blocks_full() const { return intermediate / 32; }
};

ExpertSliceLayout ExpertSliceOf(int64_t hidden, int64_t intermediate, int tp_rank, int tp_size);

// Host copies of every held expert's slice for `tp_rank` of `tp_size`;
// `weights` keeps everything else (and the full experts' owner alive until
// the copies are made). The copies' owner joins `keepalive`.
ModelWeights SliceExpertsForTp(ModelWeights weights, int tp_rank, int tp_size);

}  // namespace flotilla
