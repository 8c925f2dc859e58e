// The experts' re-layout for the FP8 decode (moe_w4a8.h describes the
// slabs): one thread per row finds its largest block scale, then one per
// (row, block) writes the block's 4 re-laid words and its k byte.
#include <algorithm>

#include "kernels/cuda/moe_w4a8.h"

namespace flotilla::kernels::cuda {
namespace {

constexpr int kTileRows = kMoeW4a8TileRows;

// The reduction's split: 3 parts where the blocks allow (H200, 120b: 3
// measured faster than 2 or 5 at 2-4 tokens, kernels/moe_notes.md).
int PartsFor(int blocks) { return blocks % 3 == 0 ? 3 : blocks % 2 == 0 ? 2 : 1; }

__host__ __device__ inline size_t SlabBytes(int blocks_per_part) {
  return (static_cast<size_t>(kTileRows) * blocks_per_part * 17 + 15) / 16 * 16;
}

// S per row: the largest scale byte of the row (0: the row is zero); rows
// past R (the last tile's padding) get 0. Counts the blocks that will be
// flushed (nonzero, more than 14 below S).
__global__ void RowExpKernel(const uint8_t* scales, int experts, int rows, int blocks,
                             int row_tiles, uint8_t* row_exp, unsigned long long* flushed) {
  const long long padded = static_cast<long long>(row_tiles) * kTileRows;
  const long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x;
  if (i >= experts * padded) return;
  const int e = static_cast<int>(i / padded), r = static_cast<int>(i % padded);
  if (r >= rows) {
    row_exp[i] = 0;
    return;
  }
  const uint8_t* s = scales + (static_cast<size_t>(e) * rows + r) * blocks;
  int top = 0;
  for (int b = 0; b < blocks; ++b) top = max(top, static_cast<int>(s[b]));
  int lost = 0;
  for (int b = 0; b < blocks; ++b) lost += s[b] != 0 && s[b] < top - 14;
  row_exp[i] = static_cast<uint8_t>(top);
  if (lost > 0) atomicAdd(flushed, static_cast<unsigned long long>(lost));
}

// Nibble v (0..31) of a checkpoint block: value 2i in byte i's low nibble.
__device__ __forceinline__ uint32_t NibbleAt(const uint8_t (&b)[16], int v) {
  return (b[v >> 1] >> ((v & 1) * 4)) & 15u;
}

// One (expert, row, block): its 16 bytes as 4 re-laid words and its k byte.
__global__ void RelayKernel(const uint8_t* blocks_in, const uint8_t* scales, int experts, int rows,
                            int blocks, int row_tiles, int parts, const uint8_t* row_exp,
                            uint8_t* slabs) {
  const long long padded = static_cast<long long>(row_tiles) * kTileRows;
  const long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x;
  if (i >= experts * padded * blocks) return;
  const int b = static_cast<int>(i % blocks);
  const long long er = i / blocks;
  const int e = static_cast<int>(er / padded), r = static_cast<int>(er % padded);
  const int per = blocks / parts, part = b / per, bl = b % per;
  const int rt = r / kTileRows, rl = r % kTileRows;
  uint8_t* slab =
      slabs + ((static_cast<size_t>(e) * row_tiles + rt) * parts + part) * SlabBytes(per);
  uint4 words = make_uint4(0, 0, 0, 0);
  int k = 15;
  if (r < rows) {
    const size_t at = (static_cast<size_t>(e) * rows + r) * blocks + b;
    const int top = row_exp[er], s = scales[at];
    if (s != 0 && top != 0 && s >= top - 14) k = s - top + 14;
    uint8_t bytes[16];
    const uint4 raw = *reinterpret_cast<const uint4*>(blocks_in + at * 16);
    memcpy(bytes, &raw, 16);
    uint32_t w[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      uint32_t v = 0;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint32_t lo = NibbleAt(bytes, 4 * q + j), hi = NibbleAt(bytes, 16 + 4 * q + j);
        v |= (lo & 7u) << (4 * j) | (lo >> 3) << (8 * j + 7);
        v |= (hi & 7u) << (16 + 4 * j) | (hi >> 3) << (8 * j + 3);
      }
      w[q] = v;
    }
    words = make_uint4(w[0], w[1], w[2], w[3]);
  }
  *reinterpret_cast<uint4*>(slab + (static_cast<size_t>(bl) * kTileRows + rl) * 16) = words;
  slab[static_cast<size_t>(kTileRows) * per * 16 + bl * kTileRows + rl] = static_cast<uint8_t>(k);
}

cudaError_t RelayProjection(const uint8_t* blocks, const uint8_t* scales, const uint16_t* bias,
                            int experts, int rows, int reduction, MoeW4a8Projection* p,
                            unsigned long long* flushed, cudaStream_t stream) {
  p->rows = rows;
  p->row_tiles = (rows + kTileRows - 1) / kTileRows;
  p->blocks = reduction / 32;
  p->parts = PartsFor(p->blocks);
  p->slab_bytes = SlabBytes(p->blocks / p->parts);
  p->bias = bias;
  const long long padded_rows = static_cast<long long>(experts) * p->row_tiles * kTileRows;
  cudaError_t err = cudaMalloc(&p->slabs, p->slab_bytes * experts * p->row_tiles * p->parts);
  if (err == cudaSuccess) err = cudaMalloc(&p->row_exp, padded_rows);
  if (err != cudaSuccess) return err;
  RowExpKernel<<<static_cast<unsigned>((padded_rows + 255) / 256), 256, 0, stream>>>(
      scales, experts, rows, p->blocks, p->row_tiles, p->row_exp, flushed);
  const long long items = padded_rows * p->blocks;
  RelayKernel<<<static_cast<unsigned>((items + 255) / 256), 256, 0, stream>>>(
      blocks, scales, experts, rows, p->blocks, p->row_tiles, p->parts, p->row_exp, p->slabs);
  return cudaGetLastError();
}

}  // namespace

cudaError_t RelayMoeW4a8(const MoeDeviceWeights& w, MoeW4a8Weights* out, cudaStream_t stream) {
  if (out == nullptr || w.num_experts <= 0 || w.num_experts > kMoeW4a8MaxExperts || w.hidden <= 0 ||
      w.intermediate <= 0 || w.hidden % 32 != 0 || w.intermediate % 32 != 0 || w.hidden > 8192 ||
      w.intermediate > 8192) {
    return cudaErrorInvalidValue;
  }
  *out = MoeW4a8Weights{};
  out->num_experts = w.num_experts;
  out->hidden = w.hidden;
  out->intermediate = w.intermediate;
  unsigned long long* flushed = nullptr;
  cudaError_t err = cudaMalloc(&flushed, sizeof(*flushed));
  if (err == cudaSuccess) err = cudaMemsetAsync(flushed, 0, sizeof(*flushed), stream);
  if (err == cudaSuccess) {
    err = RelayProjection(w.gate_up_blocks, w.gate_up_scales, w.gate_up_bias, w.num_experts,
                          2 * w.intermediate, w.hidden, &out->gate_up, flushed, stream);
  }
  if (err == cudaSuccess) {
    err = RelayProjection(w.down_blocks, w.down_scales, w.down_bias, w.num_experts, w.hidden,
                          w.intermediate, &out->down, flushed, stream);
  }
  unsigned long long lost = 0;
  if (err == cudaSuccess) {
    err = cudaMemcpyAsync(&lost, flushed, sizeof(lost), cudaMemcpyDeviceToHost, stream);
  }
  if (err == cudaSuccess) err = cudaStreamSynchronize(stream);
  cudaFree(flushed);
  if (err != cudaSuccess) {
    FreeMoeW4a8(out);
    return err;
  }
  out->flushed_blocks = static_cast<long long>(lost);
  return cudaSuccess;
}

void FreeMoeW4a8(MoeW4a8Weights* w) {
  if (w == nullptr) return;
  for (MoeW4a8Projection* p : {&w->gate_up, &w->down}) {
    cudaFree(p->slabs);
    cudaFree(p->row_exp);
  }
  *w = MoeW4a8Weights{};
}

}  // namespace flotilla::kernels::cuda
