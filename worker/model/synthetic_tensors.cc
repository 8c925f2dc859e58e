#include "worker/model/synthetic_tensors.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "common/tokenizer/tokenizer.h"

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
  return SyntheticFill{
      SyntheticFillKind::kNormal, static_cast<float>(mean), static_cast<float>(stddev), 127, {}};
}

SyntheticFill Scales(double target_rms) {
  return SyntheticFill{SyntheticFillKind::kScales, 0, 0, ScaleBaseFor(target_rms), {}};
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

// The chain form's embedding scale: 32x the plain one, so that what the
// layers add (each about as large as one plain embedding) stays small beside
// the current token's embedding through all 36 layers of 120b.
constexpr double kChainEmbeddingScale = 32;

// The chain's permutation r -> (a r + b) mod n: a near n / golden ratio and
// coprime with n, so consecutive tokens land far apart.
struct ChainPermutation {
  uint64_t n = 0, a = 1, b = 0;
};

ChainPermutation ChainPermutationFor(const ModelConfig& c) {
  ChainPermutation p;
  p.n = static_cast<uint64_t>(SyntheticChainTokens(c));
  if (p.n < 2) return p;
  p.a = static_cast<uint64_t>(static_cast<double>(p.n) * 0.6180339887) | 1;
  while (std::gcd(p.a, p.n) != 1) p.a += 2;
  p.a %= p.n;
  p.b = p.n / 3;
  return p;
}

// x with a * x = 1 (mod n), for gcd(a, n) = 1 (extended Euclid).
uint64_t InverseMod(uint64_t a, uint64_t n) {
  int64_t t = 0, new_t = 1;
  int64_t r = static_cast<int64_t>(n), new_r = static_cast<int64_t>(a % n);
  while (new_r != 0) {
    const int64_t q = r / new_r;
    t = std::exchange(new_t, t - q * new_t);
    r = std::exchange(new_r, r - q * new_r);
  }
  return static_cast<uint64_t>(t < 0 ? t + static_cast<int64_t>(n) : t);
}

}  // namespace

int32_t SyntheticChainTokens(const ModelConfig& c) {
  int32_t n = std::min<int32_t>(c.vocab_size, tokenizer::kFirstSpecialId);
  for (int id : c.eos_token_ids) {
    if (id >= 0) n = std::min(n, id);
  }
  if (c.pad_token_id >= 0) n = std::min(n, c.pad_token_id);
  return n;
}

int32_t SyntheticChainNext(const ModelConfig& c, int32_t token) {
  const ChainPermutation p = ChainPermutationFor(c);
  if (token < 0 || static_cast<uint64_t>(token) >= p.n) return -1;
  // lm_head row v is embedding row (a v + b) mod n: the row that matches
  // `token`'s embedding is v = a^-1 (token - b) mod n.
  const uint64_t shifted = (static_cast<uint64_t>(token) + p.n - p.b) % p.n;
  return static_cast<int32_t>(InverseMod(p.a, p.n) * shifted % p.n);
}

uint64_t SyntheticTensorSeed(uint64_t seed, absl::string_view name) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a
  for (unsigned char ch : name) h = (h ^ ch) * 0x100000001b3ull;
  return SyntheticDraw(seed ^ h, 0);
}

SyntheticFill SyntheticFillFor(const ModelConfig& c, absl::string_view name,
                               const SyntheticWeights& weights) {
  const double H = c.hidden_size, I = c.intermediate_size;
  const double attn = static_cast<double>(c.num_attention_heads) * c.head_dim;
  auto ends = [&](absl::string_view s) { return absl::EndsWith(name, s); };
  constexpr absl::string_view kEmbedding = "model.embed_tokens.weight";
  if (name == kEmbedding) return Normal(0, weights.chain ? kChainEmbeddingScale : 1);
  if (name == "lm_head.weight") {
    SyntheticFill fill = Normal(0, 3 / std::sqrt(H));  // logits spread ~3
    if (!weights.chain) return fill;
    // The chain: the successor's logit is ~3 sqrt(H) (161 for 120b) where
    // the other logits spread ~3.
    const ChainPermutation p = ChainPermutationFor(c);
    fill.row_map = SyntheticRowMap{SyntheticTensorSeed(weights.seed, kEmbedding), p.n,
                                   static_cast<uint64_t>(c.hidden_size), p.a, p.b};
    return fill;
  }
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
  if (ends("_blocks")) return SyntheticFill{SyntheticFillKind::kBytes, 0, 0, 127, {}};
  if (ends("gate_up_proj_scales")) return Scales(1 / std::sqrt(H));
  if (ends("down_proj_scales")) return Scales(1 / std::sqrt(I));
  if (ends("gate_up_proj_bias")) return Normal(0, 0.2);
  if (ends("down_proj_bias")) return Normal(0, 0.05);
  return Normal(0, 0.02);
}

SyntheticTensor SyntheticTensorFor(const ModelConfig& config, const SyntheticWeights& weights,
                                   absl::string_view name, DType dtype) {
  return SyntheticTensor{SyntheticFillFor(config, name, weights),
                         SyntheticTensorSeed(weights.seed, name), dtype};
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
