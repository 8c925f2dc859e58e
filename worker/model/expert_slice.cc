#include "worker/model/expert_slice.h"

#include <cstring>
#include <utility>
#include <vector>

namespace flotilla {
namespace {

// The bytes the slices of one model need, kept together.
struct SliceStore {
  std::shared_ptr<const void> full;  // the full experts' owner
  std::vector<std::vector<uint8_t>> bytes;
  std::vector<std::vector<uint16_t>> halves;
};

const uint8_t* Own(SliceStore& store, std::vector<uint8_t> v) {
  store.bytes.push_back(std::move(v));
  return store.bytes.back().data();
}

const uint16_t* Own(SliceStore& store, std::vector<uint16_t> v) {
  store.halves.push_back(std::move(v));
  return store.halves.back().data();
}

ExpertWeights SliceExpert(const ExpertWeights& x, const ExpertSliceLayout& s, SliceStore& store) {
  const int64_t H = s.hidden, hb = H / 32;
  ExpertWeights out;
  out.expert_id = x.expert_id;
  const int64_t r0 = s.gate_up_row_begin(), rows = s.gate_up_rows();
  out.gate_up = Mxfp4Matrix{nullptr, nullptr, rows, H};
  out.gate_up.blocks = Own(store, std::vector<uint8_t>(x.gate_up.blocks + r0 * hb * 16,
                                                       x.gate_up.blocks + (r0 + rows) * hb * 16));
  out.gate_up.scales = Own(
      store, std::vector<uint8_t>(x.gate_up.scales + r0 * hb, x.gate_up.scales + (r0 + rows) * hb));
  out.gate_up_bias = Bf16Vector{
      Own(store, std::vector<uint16_t>(x.gate_up_bias.data + r0, x.gate_up_bias.data + r0 + rows)),
      rows};
  const int64_t b0 = s.down_block_begin(), nb = s.down_blocks(), full = s.down_blocks_full();
  std::vector<uint8_t> blocks(H * nb * 16), scales(H * nb);
  for (int64_t h = 0; h < H; ++h) {
    std::memcpy(&blocks[h * nb * 16], x.down.blocks + (h * full + b0) * 16, nb * 16);
    std::memcpy(&scales[h * nb], x.down.scales + h * full + b0, nb);
  }
  out.down = Mxfp4Matrix{Own(store, std::move(blocks)), Own(store, std::move(scales)), H, nb * 32};
  std::vector<uint16_t> bias(H, 0);
  if (s.down_bias) std::memcpy(bias.data(), x.down_bias.data, H * sizeof(uint16_t));
  out.down_bias = Bf16Vector{Own(store, std::move(bias)), H};
  return out;
}

}  // namespace

ExpertSliceLayout ExpertSliceOf(int64_t hidden, int64_t intermediate, int tp_rank, int tp_size) {
  ExpertSliceLayout s;
  s.hidden = hidden;
  s.intermediate = intermediate;
  s.slice = IntermediateSliceOf(static_cast<int>(intermediate), tp_rank, tp_size);
  s.down_bias = tp_rank == 0;
  return s;
}

ModelWeights SliceExpertsForTp(ModelWeights weights, int tp_rank, int tp_size) {
  const ModelConfig& c = weights.config;
  const ExpertSliceLayout layout =
      ExpertSliceOf(c.hidden_size, c.intermediate_size, tp_rank, tp_size);
  auto store = std::make_shared<SliceStore>();
  store->full = weights.keepalive;
  for (LayerWeights& l : weights.layers) {
    for (ExpertWeights& x : l.experts) x = SliceExpert(x, layout, *store);
  }
  weights.keepalive = store;
  return weights;
}

}  // namespace flotilla
