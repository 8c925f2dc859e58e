#include "worker/model/synthetic_tensors.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/strings/match.h"

namespace flotilla {
namespace {

// Mean of fp4^2 over the 16 E2M1 codes (uniform random nibbles) and of 4^o
// over the scale offsets o in {-1, 0, 1}: rms of a weight = 2^k * sqrt(both).
constexpr double kFp4MeanSquare = 8.5625;
constexpr double kScaleOffsetMeanSquare = 1.75;

int ScaleBaseFor(double target_rms) {
  double k = std::round(std::log2(target_rms / std::sqrt(kFp4MeanSquare * kScaleOffsetMeanSquare)));
  return std::clamp(127 + static_cast<int>(k), 2, 253);
}

SyntheticFill Normal(double mean, double stddev) {
  return SyntheticFill{SyntheticFillKind::kNormal, static_cast<float>(mean),
                       static_cast<float>(stddev), 127};
}

SyntheticFill Scales(double target_rms) {
  return SyntheticFill{SyntheticFillKind::kScales, 0, 0, ScaleBaseFor(target_rms)};
}

void FillSerial(const SyntheticTensor& t, int64_t first, int64_t count, uint8_t* out) {
  const uint64_t begin = static_cast<uint64_t>(first);
  const uint64_t n = static_cast<uint64_t>(count);
  if (t.fill.kind != SyntheticFillKind::kNormal) {
    for (uint64_t i = 0; i < n; ++i) out[i] = SyntheticByte(t.fill, t.state0, begin + i);
  } else if (t.dtype == DType::kF32) {
    for (uint64_t i = 0; i < n; ++i) {
      const float v = SyntheticNormalElement(t.fill, t.state0, begin + i);
      std::memcpy(out + 4 * i, &v, 4);
    }
  } else {
    for (uint64_t i = 0; i < n; ++i) {
      const uint16_t b = FloatToBf16(SyntheticNormalElement(t.fill, t.state0, begin + i));
      std::memcpy(out + 2 * i, &b, 2);
    }
  }
}

}  // namespace

uint64_t SyntheticTensorSeed(uint64_t seed, absl::string_view name) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a
  for (unsigned char ch : name) h = (h ^ ch) * 0x100000001b3ull;
  return SyntheticDraw(seed ^ h, 0);
}

SyntheticFill SyntheticFillFor(const ModelConfig& c, absl::string_view name) {
  const double H = c.hidden_size, I = c.intermediate_size;
  const double attn = static_cast<double>(c.num_attention_heads) * c.head_dim;
  auto ends = [&](absl::string_view s) { return absl::EndsWith(name, s); };
  if (name == "model.embed_tokens.weight") return Normal(0, 1);
  if (name == "lm_head.weight") return Normal(0, 3 / std::sqrt(H));  // logits spread ~3
  if (ends("layernorm.weight") || name == "model.norm.weight") return Normal(1, 0.1);
  // Scores q.k/sqrt(D) of about unit spread; attention is neither uniform nor one-hot.
  if (ends("q_proj.weight") || ends("k_proj.weight")) return Normal(0, 1.2 / std::sqrt(H));
  if (ends("v_proj.weight")) return Normal(0, 1 / std::sqrt(H));
  if (ends("q_proj.bias") || ends("k_proj.bias") || ends("v_proj.bias")) return Normal(0, 0.2);
  if (ends("o_proj.weight")) return Normal(0, 1 / std::sqrt(attn));
  if (ends("o_proj.bias")) return Normal(0, 0.05);
  if (ends("sinks")) return Normal(0.5, 1);
  // Router logits with a spread of about 2: the top-K differ from token to token.
  if (ends("router.weight")) return Normal(0, 2 / std::sqrt(H));
  if (ends("router.bias")) return Normal(0, 0.5);
  if (ends("_blocks")) return SyntheticFill{SyntheticFillKind::kBytes, 0, 0, 127};
  if (ends("gate_up_proj_scales")) return Scales(1 / std::sqrt(H));
  if (ends("down_proj_scales")) return Scales(1 / std::sqrt(I));
  if (ends("gate_up_proj_bias")) return Normal(0, 0.2);
  if (ends("down_proj_bias")) return Normal(0, 0.05);
  return Normal(0, 0.02);
}

SyntheticTensor SyntheticTensorFor(const ModelConfig& config, uint64_t seed, absl::string_view name,
                                   DType dtype) {
  return SyntheticTensor{SyntheticFillFor(config, name), SyntheticTensorSeed(seed, name), dtype};
}

void FillSyntheticElements(const SyntheticTensor& tensor, int64_t first, int64_t count, void* out) {
  uint8_t* bytes = static_cast<uint8_t*>(out);
  const int64_t element_bytes = DTypeSize(tensor.dtype);
  constexpr int64_t kPerThread = int64_t{1} << 20;
  const int64_t threads = std::min<int64_t>(std::max(1u, std::thread::hardware_concurrency()),
                                            (count + kPerThread - 1) / kPerThread);
  if (threads <= 1) {
    FillSerial(tensor, first, count, bytes);
    return;
  }
  const int64_t per = (count + threads - 1) / threads;
  std::vector<std::thread> pool;
  for (int64_t begin = 0; begin < count; begin += per) {
    const int64_t n = std::min(per, count - begin);
    pool.emplace_back([&tensor, first, begin, n, bytes, element_bytes] {
      FillSerial(tensor, first + begin, n, bytes + begin * element_bytes);
    });
  }
  for (std::thread& t : pool) t.join();
}

}  // namespace flotilla
