// The gpt-oss op set on the CPU (reference backend): f32 math, bf16 and MXFP4
// weights read in place (never expanded to a full f32 copy). Every op that
// takes a ThreadPool* runs serially when it is nullptr. See MODEL.md for the
// exact definitions; tests/kernels/ checks each op against a naive version.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/cpu/thread_pool.h"

namespace flotilla::kernels::cpu {

// Dot product of two f32 vectors with 16 partial sums (so g++ vectorises it).
float Dot(const float* a, const float* b, int64_t n);

// out[i, :] = f32(table[ids[i], :]); table rows are `row_stride` elements apart.
// The caller has checked every id.
void EmbeddingGather(const uint16_t* table, int64_t row_stride, int64_t hidden,
                     const int32_t* ids, int64_t n, float* out);

// out[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * weight (bf16). out may be x.
void RmsNorm(const float* x, const uint16_t* weight, int64_t rows, int64_t hidden, float eps,
             float* out);

// y[t, o] = sum_i x[t, i] * w[o, i] + bias[o] for t < rows, o < out_features.
// w is bf16 [out_features, in_features] with rows `w_stride` apart; bias may be
// nullptr. Each weight row is read once per call whatever `rows` is.
void LinearBf16(ThreadPool* pool, const float* x, int64_t rows, int64_t in_features,
                const uint16_t* w, int64_t w_stride, int64_t out_features, const uint16_t* bias,
                float* y);

// y[t, o] = sum_i x[t, i] * W[o, i] + bias[o] with W in MXFP4: `blocks`
// [out, in/32, 16] bytes (low nibble = even element), `scales` [out, in/32]
// (value = fp4 * 2^(scale - 127)). The nibbles and scales are decoded inside
// the dot products, one weight row at a time. in_features % 32 == 0.
void LinearMxfp4(ThreadPool* pool, const float* x, int64_t rows, int64_t in_features,
                 const uint8_t* blocks, const uint8_t* scales, int64_t out_features,
                 const uint16_t* bias, float* y);

// The FP4 E2M1 value of a nibble, and 2^(scale - 127).
float Fp4Value(uint8_t nibble);
float Mxfp4Scale(uint8_t scale);

// Clamped SwiGLU over interleaved gate/up: for j < I, gate = gu[2j], up = gu[2j+1],
// gate = min(gate, limit), up = clamp(up, -limit, limit),
// out[j] = gate * sigmoid(alpha * gate) * (up + 1). gate_up [rows, 2I], out [rows, I].
void SwigluClamped(const float* gate_up, int64_t rows, int64_t intermediate, float limit,
                   float alpha, float* out);

// YaRN ("NTK by parts") RoPE parameters, as in the Hugging Face config.
struct YarnParams {
  double theta = 150000;
  int head_dim = 64;
  double factor = 32;
  double original_max_position_embeddings = 4096;
  double beta_fast = 32;
  double beta_slow = 1;
  bool truncate = false;
};

// inv_freq [head_dim / 2], computed in f32 as transformers does.
std::vector<float> YarnInvFreq(const YarnParams& p);
// The cos/sin multiplier: 0.1 ln(factor) + 1 (1 when factor <= 1).
float YarnAttentionScaling(double factor);

// Rotates x [tokens, heads, head_dim] in place at `positions` [tokens]:
// halves x1 = x[:D/2], x2 = x[D/2:] become [x1 c - x2 s, x2 c + x1 s] with
// c = cos(p inv_freq) * scaling, s = sin(p inv_freq) * scaling.
void ApplyRope(float* x, int64_t tokens, int64_t heads, int64_t head_dim,
               const int64_t* positions, const float* inv_freq, float scaling);

// Keys and values of one sequence in one layer already in the paged cache.
// A block holds K [block_size, kv_heads, D] then V [block_size, kv_heads, D];
// position j lives in block block_table[j / block_size] (-1: freed).
struct KvCacheView {
  const float* arena = nullptr;
  const int32_t* block_table = nullptr;
  int64_t block_size = 0;
  int64_t block_floats = 0;  // floats per block: 2 * block_size * kv_heads * D
  int64_t begin = 0;         // oldest cached position still held
  int64_t end = 0;           // one past the newest cached position
};

// One sequence's share of an attention call: `num_new` query tokens at
// positions start_pos.. attend causally to the cached positions (which must
// run up to start_pos) and to the new keys themselves.
struct AttentionItem {
  KvCacheView cache;
  const float* q = nullptr;      // [num_new, q_heads, D]
  const float* k_new = nullptr;  // [num_new, kv_heads, D]
  const float* v_new = nullptr;  // [num_new, kv_heads, D]
  int64_t num_new = 0;
  int64_t start_pos = 0;
  float* out = nullptr;  // [num_new, q_heads, D]
};

// Attention with sinks and an optional sliding window (window 0 = full) for a
// batch of sequences: score = q.k * scale, query i sees keys j with
// max(0, i - window + 1) <= j <= i; softmax over the scores plus sinks[h]
// whose mass is dropped; q head h uses kv head h / (q_heads / kv_heads).
// Returns false if a needed cached position is not held (nothing is written
// for that item).
bool Attention(ThreadPool* pool, const AttentionItem* items, int64_t num_items, int64_t q_heads,
               int64_t kv_heads, int64_t head_dim, const float* sinks, int64_t window,
               float scale);

// Router: for each row of logits [rows, E] the K largest (descending, ties to
// the lower index as torch.topk does) and the softmax over those K only.
void RouterTopK(const float* logits, int64_t rows, int64_t num_experts, int64_t k,
                int32_t* indices, float* weights);

}  // namespace flotilla::kernels::cpu
