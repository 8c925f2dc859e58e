// Views of the weights one rank holds, as the engines consume them.
// The views point into memory-mapped checkpoint files (or into buffers owned
// through `keepalive`); nothing is copied or dequantised on load, except the
// attention sinks, which are converted to f32.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model_config.h"

namespace flotilla {

// Row-major bf16 matrix; element (r, c) is data[r * row_stride + c].
struct Bf16Matrix {
  const uint16_t* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t row_stride = 0;  // in elements; == cols unless this is a column slice
};

struct Bf16Vector {
  const uint16_t* data = nullptr;
  int64_t size = 0;
};

// MXFP4 matrix of `rows` output features by `cols` inputs (cols % 32 == 0):
// blocks [rows, cols/32, 16] bytes (two FP4 E2M1 nibbles per byte, low nibble
// first), scales [rows, cols/32] bytes (power-of-two exponent, bias 127).
struct Mxfp4Matrix {
  const uint8_t* blocks = nullptr;
  const uint8_t* scales = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
};

// One expert's MLP: gate_up has 2I rows (gate and up interleaved), down has H rows.
struct ExpertWeights {
  int expert_id = -1;  // logical expert index in [0, E)
  Mxfp4Matrix gate_up;
  Bf16Vector gate_up_bias;  // [2I]
  Mxfp4Matrix down;
  Bf16Vector down_bias;  // [H]
};

// The attention heads one rank holds: q heads [q_head_begin, +q_heads) and the
// kv heads they use [kv_head_begin, +kv_heads). With tensor parallelism of size
// T, rank t holds NH/T q heads and NKV/T kv heads.
struct AttentionWeights {
  int q_head_begin = 0;
  int q_heads = 0;
  int kv_head_begin = 0;
  int kv_heads = 0;
  Bf16Matrix wq;  // [q_heads*D, H]
  Bf16Vector bq;  // [q_heads*D]
  Bf16Matrix wk;  // [kv_heads*D, H]
  Bf16Vector bk;
  Bf16Matrix wv;  // [kv_heads*D, H]
  Bf16Vector bv;
  Bf16Matrix wo;  // [H, q_heads*D]: a column slice of o_proj (row_stride NH*D)
  Bf16Vector bo;  // [H], the full bias: exactly one rank of a TP group adds it
  std::vector<float> sinks;  // [q_heads], converted to f32
};

struct LayerWeights {
  Bf16Vector input_norm;      // [H]
  Bf16Vector post_attn_norm;  // [H]
  AttentionWeights attn;
  Bf16Matrix router;       // [E, H]
  Bf16Vector router_bias;  // [E]
  std::vector<ExpertWeights> experts;  // the experts this rank holds, by slot
  std::vector<int> slot_of_expert;     // [E]: slot in `experts`, or -1 if not held
};

struct ModelWeights {
  ModelConfig config;
  Bf16Matrix embed;  // [V, H]; empty when not loaded
  std::vector<LayerWeights> layers;
  Bf16Vector final_norm;  // [H]
  Bf16Matrix lm_head;     // [V, H]; empty when not loaded
  std::shared_ptr<const void> keepalive;  // owns the mappings / buffers viewed above
};

// Which part of the model a rank loads.
struct ShardSpec {
  int tp_rank = 0;
  int tp_size = 1;            // must divide num_attention_heads and num_key_value_heads
  std::vector<int> experts;   // logical experts to hold; empty means all
  bool load_embedding = true;
  bool load_lm_head = true;
};

}  // namespace flotilla
