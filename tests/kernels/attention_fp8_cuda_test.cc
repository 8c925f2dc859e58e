// The FP8 KV cache on the GPU (label gpu; skipped without a device):
// LaunchKvQuantize stores exactly the codes and scales of the CPU rule
// (kernels/cpu/kv_fp8.h), and LaunchAttention (decode and prefill shapes,
// with and without a window) and LaunchAttentionGeneric read an FP8 layer
// as a naive f64 attention over the dequantized keys and values does, at
// gpt-oss shapes (64 q heads, 8 kv heads of 64). Blocks no sequence holds
// are filled with NaN codes and scales: the kernels must never use them.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

#include "common/bf16.h"
#include "kernels/cpu/kv_fp8.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/attention_generic.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/kv_quant.h"
#include "tests/kernels/cuda_test_util.h"

namespace flotilla::kernels {
namespace {

constexpr int kBs = 16;
// As the CUDA engine lays out an FP8 layer: a block where a bf16 block would be.
constexpr long long kBlockBytes = static_cast<long long>(kKvHeads) * kBs * kHeadDim * 2;

using AttentionFp8CudaTest = CudaTest;  // skips without a GPU

// An FP8 layer of `blocks` blocks over the device codes `k8` and `v8`.
cuda::PagedKvLayer Fp8Layer(int blocks, uint8_t* k8, uint8_t* v8) {
  cuda::PagedKvLayer cache;
  cache.num_blocks = blocks;
  cache.block_size = kBs;
  cache.kv_heads = kKvHeads;
  cache.head_dim = kHeadDim;
  cache.k8 = k8;
  cache.v8 = v8;
  cache.fp8_block_bytes = kBlockBytes;
  return cache;
}

template <typename T>
struct DeviceArray {
  T* p = nullptr;
  explicit DeviceArray(const std::vector<T>& h) {
    EXPECT_EQ(cudaMalloc(&p, std::max<size_t>(1, h.size()) * sizeof(T)), cudaSuccess);
    if (!h.empty()) {
      EXPECT_EQ(cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
    }
  }
  ~DeviceArray() { cudaFree(p); }
  std::vector<T> Read(size_t n) const {
    std::vector<T> h(n);
    EXPECT_EQ(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }
};

// Byte offsets of a position's codes and scale in an FP8 layer's block array.
size_t CodeAt(int block, int head, int slot) {
  return static_cast<size_t>(block) * kBlockBytes +
         (static_cast<size_t>(head) * kBs + slot) * kHeadDim;
}
size_t ScaleAt(int block, int head, int slot) {
  return static_cast<size_t>(block) * kBlockBytes + static_cast<size_t>(kKvHeads) * kBs * kHeadDim +
         (static_cast<size_t>(head) * kBs + slot) * 2;
}

// Random values of one head, some heads 50x larger (the scale follows each),
// all times `mag`.
std::vector<float> HeadValues(std::mt19937& rng, int n, float mag = 1.0f) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  if (rng() % 5 == 0) mag *= 50.0f;
  std::vector<float> x(n);
  for (float& v : x) v = Bf16ToFloat(FloatToBf16(nd(rng) * mag));
  return x;
}

TEST_F(AttentionFp8CudaTest, QuantizeStoresTheCpuRulesCodes) {
  std::mt19937 rng(11);
  constexpr int kTokens = 37, kBlocks = 6;
  std::vector<uint16_t> k(kTokens * kKvHeads * kHeadDim), v(k.size());
  for (int r = 0; r < kTokens * kKvHeads; ++r) {
    const std::vector<float> kx = HeadValues(rng, kHeadDim), vx = HeadValues(rng, kHeadDim);
    for (int d = 0; d < kHeadDim; ++d) {
      // Head 3 of token 5 is all zeros (scale 1, codes 0).
      k[r * kHeadDim + d] = r == 5 * kKvHeads + 3 ? 0 : FloatToBf16(kx[d]);
      v[r * kHeadDim + d] = FloatToBf16(vx[d]);
    }
  }
  std::vector<int32_t> slots(kTokens);
  std::iota(slots.begin(), slots.end(), 40);
  std::shuffle(slots.begin(), slots.end(), rng);
  slots[7] = -1;             // not stored
  slots[8] = kBlocks * kBs;  // past the cache: not stored
  DeviceArray<uint16_t> dk(k), dv(v);
  DeviceArray<int32_t> dslots(slots);
  const std::vector<uint8_t> zero(kBlocks * kBlockBytes, 0);
  DeviceArray<uint8_t> k8(zero), v8(zero);
  const cuda::PagedKvLayer cache = Fp8Layer(kBlocks, k8.p, v8.p);
  ASSERT_EQ(cuda::LaunchKvQuantize(dk.p, dv.p, dslots.p, kTokens, cache, nullptr), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<uint8_t> gk = k8.Read(zero.size()), gv = v8.Read(zero.size());

  std::vector<uint8_t> want_k = zero, want_v = zero;
  for (int t = 0; t < kTokens; ++t) {
    if (slots[t] < 0 || slots[t] >= kBlocks * kBs) continue;
    const int blk = slots[t] / kBs, off = slots[t] % kBs;
    for (int h = 0; h < kKvHeads; ++h) {
      for (auto [src, dst] : {std::make_pair(&k, &want_k), std::make_pair(&v, &want_v)}) {
        float x[kHeadDim];
        for (int d = 0; d < kHeadDim; ++d)
          x[d] = Bf16ToFloat((*src)[(t * kKvHeads + h) * kHeadDim + d]);
        uint16_t scale = 0;
        cpu::QuantizeKvHead(x, kHeadDim, dst->data() + CodeAt(blk, h, off), &scale);
        (*dst)[ScaleAt(blk, h, off)] = static_cast<uint8_t>(scale & 0xff);
        (*dst)[ScaleAt(blk, h, off) + 1] = static_cast<uint8_t>(scale >> 8);
      }
    }
  }
  size_t diff_k = 0, diff_v = 0;
  for (size_t i = 0; i < zero.size(); ++i) {
    diff_k += gk[i] != want_k[i];
    diff_v += gv[i] != want_v[i];
  }
  EXPECT_EQ(diff_k, 0u) << "bytes of K differing from the CPU rule";
  EXPECT_EQ(diff_v, 0u) << "bytes of V differing from the CPU rule";
}

// One attention call over an FP8 layer: sequence b holds seq_lens[b]
// positions, the last n[b] of which are its queries.
struct Fp8Problem {
  std::vector<int> seq_lens, n;
  int window = 0;
  int num_blocks = 0, max_blocks = 0;
  std::vector<int32_t> tables;
  std::vector<uint8_t> k8, v8;
  std::vector<std::vector<float>> keys, values;  // per sequence, dequantized [L, kv, D]
  std::vector<uint16_t> q;                       // [total_q, q_heads, D]
  std::vector<int32_t> q_start;
  std::vector<float> sinks;

  // v_mag and q_mag scale the values and the queries (small queries: flat
  // attention, every probability small).
  Fp8Problem(std::vector<int> lens, std::vector<int> news, int win, uint32_t seed,
             float v_mag = 1.0f, float q_mag = 1.0f)
      : seq_lens(std::move(lens)), n(std::move(news)), window(win) {
    std::mt19937 rng(seed);
    const int batch = static_cast<int>(seq_lens.size());
    for (int L : seq_lens) max_blocks = std::max(max_blocks, (L + kBs - 1) / kBs);
    num_blocks = batch * max_blocks + 3;  // spare blocks stay NaN
    std::vector<int32_t> order(num_blocks);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    tables.assign(static_cast<size_t>(batch) * max_blocks, -1);
    k8.assign(static_cast<size_t>(num_blocks) * kBlockBytes, 0xff);  // NaN codes and scales
    v8 = k8;
    keys.resize(batch);
    values.resize(batch);
    int next = 0;
    for (int b = 0; b < batch; ++b) {
      const int L = seq_lens[b];
      keys[b].resize(static_cast<size_t>(L) * kKvHeads * kHeadDim);
      values[b].resize(keys[b].size());
      for (int blk = 0; blk < (L + kBs - 1) / kBs; ++blk)
        tables[b * max_blocks + blk] = order[next++];
      for (int p = 0; p < L; ++p) {
        const int blk = tables[b * max_blocks + p / kBs], off = p % kBs;
        for (int h = 0; h < kKvHeads; ++h) {
          Store(rng, &k8, blk, h, off,
                keys[b].data() + (static_cast<size_t>(p) * kKvHeads + h) * kHeadDim);
          Store(rng, &v8, blk, h, off,
                values[b].data() + (static_cast<size_t>(p) * kKvHeads + h) * kHeadDim, v_mag);
        }
      }
    }
    q_start.push_back(0);
    for (int b = 0; b < batch; ++b) q_start.push_back(q_start.back() + n[b]);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    q.resize(static_cast<size_t>(q_start.back()) * kQHeads * kHeadDim);
    for (uint16_t& x : q) x = FloatToBf16(q_mag * nd(rng));
    sinks.resize(kQHeads);
    for (float& s : sinks) s = nd(rng);
  }

  // Quantizes a random head into `arr` and keeps what the cache gives back.
  static void Store(std::mt19937& rng, std::vector<uint8_t>* arr, int blk, int h, int off,
                    float* back, float mag = 1.0f) {
    const std::vector<float> x = HeadValues(rng, kHeadDim, mag);
    uint16_t scale = 0;
    cpu::QuantizeKvHead(x.data(), kHeadDim, arr->data() + CodeAt(blk, h, off), &scale);
    (*arr)[ScaleAt(blk, h, off)] = static_cast<uint8_t>(scale & 0xff);
    (*arr)[ScaleAt(blk, h, off) + 1] = static_cast<uint8_t>(scale >> 8);
    for (int d = 0; d < kHeadDim; ++d) {
      back[d] = cpu::E4m3ToFloat((*arr)[CodeAt(blk, h, off) + d]) * Bf16ToFloat(scale);
    }
  }

  // Naive attention with sinks in f64 over the dequantized keys and values.
  std::vector<float> Reference() const {
    std::vector<float> out(q.size());
    const int group = kQHeads / kKvHeads;
    for (size_t b = 0; b < seq_lens.size(); ++b) {
      const int L = seq_lens[b];
      for (int i = 0; i < n[b]; ++i) {
        const int p = L - n[b] + i;
        const int lo = window > 0 ? std::max(0, p - window + 1) : 0;
        for (int h = 0; h < kQHeads; ++h) {
          const uint16_t* qv =
              q.data() + ((q_start[b] + i) * static_cast<size_t>(kQHeads) + h) * kHeadDim;
          const int g = h / group;
          std::vector<double> s(p - lo + 1);
          double m = sinks[h];
          for (int j = lo; j <= p; ++j) {
            double dot = 0;
            const float* kv = keys[b].data() + (static_cast<size_t>(j) * kKvHeads + g) * kHeadDim;
            for (int d = 0; d < kHeadDim; ++d)
              dot += static_cast<double>(Bf16ToFloat(qv[d])) * kv[d];
            s[j - lo] = dot * kAttentionScale;
            m = std::max(m, s[j - lo]);
          }
          double sum = std::exp(sinks[h] - m);
          std::vector<double> acc(kHeadDim, 0.0);
          for (int j = lo; j <= p; ++j) {
            const double e = std::exp(s[j - lo] - m);
            sum += e;
            const float* vv = values[b].data() + (static_cast<size_t>(j) * kKvHeads + g) * kHeadDim;
            for (int d = 0; d < kHeadDim; ++d) acc[d] += e * vv[d];
          }
          float* o = out.data() + ((q_start[b] + i) * static_cast<size_t>(kQHeads) + h) * kHeadDim;
          for (int d = 0; d < kHeadDim; ++d) o[d] = static_cast<float>(acc[d] / sum);
        }
      }
    }
    return out;
  }
};

// Runs the fast kernel (generic = false) or the generic one on the problem
// and compares with the reference: |got - ref| <= 1e-2 max |ref| + 1e-2 |ref|
// (bf16 output, bf16 probabilities in P V).
void RunAndCompare(const Fp8Problem& p, bool generic, const char* what) {
  DeviceArray<uint8_t> k8(p.k8), v8(p.v8);
  DeviceArray<int32_t> tables(p.tables), q_start(p.q_start);
  DeviceArray<int32_t> lens(std::vector<int32_t>(p.seq_lens.begin(), p.seq_lens.end()));
  DeviceArray<uint16_t> q(p.q);
  DeviceArray<float> sinks(p.sinks);
  DeviceArray<uint16_t> out(std::vector<uint16_t>(p.q.size(), 0xffff));
  const cuda::PagedKvLayer cache = Fp8Layer(p.num_blocks, k8.p, v8.p);
  cuda::AttentionBatch batch;
  batch.block_tables = tables.p;
  batch.max_blocks_per_seq = p.max_blocks;
  batch.seq_lens = lens.p;
  batch.q_start = q_start.p;
  batch.batch = static_cast<int>(p.seq_lens.size());
  batch.total_q = p.q_start.back();
  batch.max_seq_len = *std::max_element(p.seq_lens.begin(), p.seq_lens.end());
  batch.max_q_per_seq = *std::max_element(p.n.begin(), p.n.end());
  if (generic) {
    ASSERT_EQ(cuda::LaunchAttentionGeneric(q.p, cache, batch, kQHeads, sinks.p, p.window,
                                           kAttentionScale, out.p, nullptr),
              cudaSuccess);
  } else {
    const size_t ws_bytes = cuda::AttentionWorkspaceBytes(batch, kQHeads, kHeadDim);
    DeviceArray<uint8_t> ws(std::vector<uint8_t>(ws_bytes, 0));
    ASSERT_EQ(cuda::LaunchAttention(q.p, cache, batch, kQHeads, sinks.p, p.window, kAttentionScale,
                                    out.p, ws.p, ws_bytes, nullptr),
              cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<uint16_t> got = out.Read(p.q.size());
  const std::vector<float> ref = p.Reference();
  float max_ref = 0;
  for (float r : ref) max_ref = std::max(max_ref, std::fabs(r));
  size_t bad = 0, first = 0;
  double worst = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const float err = std::fabs(Bf16ToFloat(got[i]) - ref[i]);
    if (!(err <= 1e-2f * max_ref + 1e-2f * std::fabs(ref[i]))) {
      if (bad++ == 0) first = i;
    }
    if (std::isfinite(err)) worst = std::max<double>(worst, err);
  }
  EXPECT_EQ(bad, 0u) << what << ": first bad element " << first << " got "
                     << Bf16ToFloat(got[first]) << " want " << ref[first];
  std::printf("%s: max |err| %.3g, max |ref| %.3g\n", what, worst, max_ref);
}

TEST_F(AttentionFp8CudaTest, DecodeMatchesTheDequantizedReference) {
  for (bool generic : {false, true}) {
    const char* kernel = generic ? "generic" : "fast";
    for (int window : {0, 128}) {
      SCOPED_TRACE(std::string(kernel) + " window " + std::to_string(window));
      RunAndCompare(Fp8Problem({1, 100, 3000, 17}, {1, 1, 1, 1}, window, 5), generic,
                    "fp8 decode batch 4");
      RunAndCompare(Fp8Problem({40, 2500}, {4, 4}, window, 6), generic, "fp8 decode 4 tokens");
      RunAndCompare(Fp8Problem({20000}, {1}, window, 7), generic, "fp8 decode 20000 keys");
      RunAndCompare(Fp8Problem(std::vector<int>(12, 700), std::vector<int>(12, 1), window, 8),
                    generic, "fp8 decode batch 12");
      // The decode kernel's probabilities times V scales in f16: values of
      // 1e-3 over flat attention (every probability ~1/20000), and values
      // of 1e2 (up to ~2e4: the f16 products saturate past ~1.1e5).
      RunAndCompare(Fp8Problem({20000, 5000}, {1, 1}, window, 11, 1e-3f, 1e-3f), generic,
                    "fp8 decode small values, flat attention");
      RunAndCompare(Fp8Problem({3000}, {1}, window, 12, 1e2f), generic, "fp8 decode large values");
    }
  }
}

TEST_F(AttentionFp8CudaTest, PrefillMatchesTheDequantizedReference) {
  for (bool generic : {false, true}) {
    for (int window : {0, 128}) {
      SCOPED_TRACE(std::string(generic ? "generic" : "fast") + " window " + std::to_string(window));
      RunAndCompare(Fp8Problem({300}, {300}, window, 9), generic, "fp8 prefill 300");
      RunAndCompare(Fp8Problem({240, 33}, {40, 1}, window, 10), generic,
                    "fp8 chunk over a cached prefix + decode");
    }
  }
}

}  // namespace
}  // namespace flotilla::kernels
