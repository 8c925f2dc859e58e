// The CUDA paged attention (decode split-KV path and tensor-core prefill path)
// against the CPU reference kernels/cpu/ops.h Attention on the same values:
// the GPU cache holds bf16, the CPU arena the same values widened to f32.
//
// Tolerance: inputs are identical, scores and the softmax are f32 on both
// sides; the GPU rounds the probabilities to bf16 before P V (relative error
// <= 2^-9 per weight, so at most 2^-9 * max|v| on an output, much less with
// random signs) and rounds the output to bf16 (2^-9 relative). We allow
// |gpu - ref| <= 1e-2 * max|ref| (over the call) + 1e-2 * |ref|, about two
// bf16 ulps of the largest output; a wrong key, mask edge, head mapping or
// sink moves outputs by far more.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "common/bf16.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/device.h"
#include "tests/kernels/cuda_test_util.h"

namespace flotilla::kernels {
namespace {

using AttentionCudaTest = CudaTest;  // skips without a GPU

template <typename T>
T* ToDevice(const std::vector<T>& h) {
  T* d = nullptr;
  EXPECT_EQ(cudaMalloc(&d, std::max<size_t>(1, h.size()) * sizeof(T)), cudaSuccess);
  if (!h.empty()) {
    EXPECT_EQ(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  return d;
}

// One attention call's data: sequence b has seq_lens[b] cached positions
// (the n[b] new ones included).
struct Problem {
  int block_size = 16;
  int window = 0;
  std::vector<int> seq_lens, n;
  int num_blocks = 0, max_blocks = 0;
  std::vector<int32_t> tables;  // [batch, max_blocks], -1 = freed/unused
  std::vector<uint16_t> k, v;   // GPU layout [num_blocks, kv, bs, D]
  std::vector<uint16_t> q;      // [total_q, q_heads, D]
  std::vector<float> sinks;
  std::vector<int32_t> q_start;
  int total_q = 0;
  // Prefill-shaped calls: warpgroup MMA (the default) or mma.sync; a host
  // bound on the sequence lengths above theirs (0: none; past 4,096 the
  // unwindowed prefill takes 128-row CTAs).
  bool prefill_wgmma = true;
  int max_seq_len = 0;
};

uint16_t RandBf16(std::mt19937& rng, float sd) {
  std::normal_distribution<float> nd(0.f, sd);
  return FloatToBf16(nd(rng));
}

Problem MakeProblem(std::vector<int> seq_lens, std::vector<int> n, int block_size, int window,
                    uint32_t seed, int spare_blocks = 8) {
  std::mt19937 rng(seed);
  Problem p;
  p.block_size = block_size;
  p.window = window;
  p.seq_lens = std::move(seq_lens);
  p.n = std::move(n);
  const int batch = static_cast<int>(p.seq_lens.size());
  int needed = 0;
  for (int b = 0; b < batch; ++b) {
    const int nb = (p.seq_lens[b] + block_size - 1) / block_size;
    p.max_blocks = std::max(p.max_blocks, nb);
    needed += nb;
  }
  p.max_blocks += 1;  // a spare column that stays -1
  p.num_blocks = needed + spare_blocks;
  std::vector<int32_t> ids(p.num_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);  // non-contiguous block tables
  p.tables.assign(static_cast<size_t>(batch) * p.max_blocks, -1);
  const size_t block_elems = static_cast<size_t>(kKvHeads) * block_size * kHeadDim;
  p.k.resize(p.num_blocks * block_elems);
  p.v.resize(p.num_blocks * block_elems);
  for (auto& x : p.k) x = RandBf16(rng, 1.0f);
  for (auto& x : p.v) x = RandBf16(rng, 1.0f);
  int next = 0;
  for (int b = 0; b < batch; ++b) {
    const int nb = (p.seq_lens[b] + block_size - 1) / block_size;
    // With a window, blocks wholly before the first query's window are freed;
    // their storage holds NaN so reading them would show.
    const int first_pos = p.seq_lens[b] - p.n[b];
    const int lo = window > 0 ? std::max(0, first_pos - window + 1) : 0;
    for (int i = 0; i < nb; ++i) {
      const int id = ids[next++];
      if ((i + 1) * block_size <= lo) {
        std::fill(p.k.begin() + id * block_elems, p.k.begin() + (id + 1) * block_elems, 0x7fc0);
        std::fill(p.v.begin() + id * block_elems, p.v.begin() + (id + 1) * block_elems, 0x7fc0);
        continue;
      }
      p.tables[static_cast<size_t>(b) * p.max_blocks + i] = id;
    }
  }
  p.q_start.assign(batch + 1, 0);
  for (int b = 0; b < batch; ++b) p.q_start[b + 1] = p.q_start[b] + p.n[b];
  p.total_q = p.q_start[batch];
  p.q.resize(static_cast<size_t>(p.total_q) * kQHeads * kHeadDim);
  for (auto& x : p.q) x = RandBf16(rng, 1.5f);
  std::uniform_real_distribution<float> sd(-1.f, 3.f);
  p.sinks.resize(kQHeads);
  for (auto& x : p.sinks) x = sd(rng);
  return p;
}

// CPU reference on the widened values.
std::vector<float> Reference(const Problem& p) {
  const int batch = static_cast<int>(p.seq_lens.size());
  const int bs = p.block_size;
  const int64_t block_floats = 2LL * bs * kKvHeads * kHeadDim;
  std::vector<float> arena(static_cast<size_t>(p.num_blocks) * block_floats);
  for (int blk = 0; blk < p.num_blocks; ++blk)
    for (int h = 0; h < kKvHeads; ++h)
      for (int s = 0; s < bs; ++s)
        for (int d = 0; d < kHeadDim; ++d) {
          const size_t src = ((static_cast<size_t>(blk) * kKvHeads + h) * bs + s) * kHeadDim + d;
          const size_t dst =
              blk * block_floats + (static_cast<size_t>(s) * kKvHeads + h) * kHeadDim + d;
          arena[dst] = Bf16ToFloat(p.k[src]);
          arena[dst + block_floats / 2] = Bf16ToFloat(p.v[src]);
        }
  std::vector<float> q(p.q.size());
  for (size_t i = 0; i < q.size(); ++i) q[i] = Bf16ToFloat(p.q[i]);
  std::vector<float> out(q.size(), 0.f);
  std::vector<std::vector<float>> knew(batch), vnew(batch);
  std::vector<cpu::AttentionItem> items(batch);
  for (int b = 0; b < batch; ++b) {
    const int start = p.seq_lens[b] - p.n[b];
    const int32_t* table = p.tables.data() + static_cast<size_t>(b) * p.max_blocks;
    knew[b].resize(static_cast<size_t>(p.n[b]) * kKvHeads * kHeadDim);
    vnew[b].resize(knew[b].size());
    for (int t = 0; t < p.n[b]; ++t) {
      const int pos = start + t;
      const float* blk = arena.data() + table[pos / bs] * block_floats;
      for (int h = 0; h < kKvHeads; ++h)
        for (int d = 0; d < kHeadDim; ++d) {
          const size_t o = (static_cast<size_t>(pos % bs) * kKvHeads + h) * kHeadDim + d;
          knew[b][(static_cast<size_t>(t) * kKvHeads + h) * kHeadDim + d] = blk[o];
          vnew[b][(static_cast<size_t>(t) * kKvHeads + h) * kHeadDim + d] =
              blk[o + block_floats / 2];
        }
    }
    cpu::AttentionItem& it = items[b];
    it.cache.arena = arena.data();
    it.cache.block_table = table;
    it.cache.block_size = bs;
    it.cache.block_floats = block_floats;
    it.cache.begin = 0;
    it.cache.end = start;
    it.q = q.data() + static_cast<size_t>(p.q_start[b]) * kQHeads * kHeadDim;
    it.k_new = knew[b].data();
    it.v_new = vnew[b].data();
    it.num_new = p.n[b];
    it.start_pos = start;
    it.out = out.data() + static_cast<size_t>(p.q_start[b]) * kQHeads * kHeadDim;
  }
  cpu::ThreadPool pool(4);
  EXPECT_TRUE(cpu::Attention(&pool, items.data(), batch, kQHeads, kKvHeads, kHeadDim,
                             p.sinks.data(), p.window, kAttentionScale));
  return out;
}

// Device copies of a problem plus the launch arguments.
struct DeviceProblem {
  uint16_t *k = nullptr, *v = nullptr, *q = nullptr, *out = nullptr;
  int32_t *tables = nullptr, *seq_lens = nullptr, *q_start = nullptr;
  float* sinks = nullptr;
  void* ws = nullptr;
  size_t ws_bytes = 0;
  cuda::PagedKvLayer cache;
  cuda::AttentionBatch batch;

  bool prefill_wgmma = true;

  explicit DeviceProblem(const Problem& p, int max_seq_len = 0) : prefill_wgmma(p.prefill_wgmma) {
    max_seq_len = std::max(max_seq_len, p.max_seq_len);
    k = ToDevice(p.k);
    v = ToDevice(p.v);
    q = ToDevice(p.q);
    tables = ToDevice(p.tables);
    std::vector<int32_t> lens(p.seq_lens.begin(), p.seq_lens.end());
    seq_lens = ToDevice(lens);
    q_start = ToDevice(p.q_start);
    sinks = ToDevice(p.sinks);
    EXPECT_EQ(cudaMalloc(&out, std::max<size_t>(1, p.q.size()) * 2), cudaSuccess);
    EXPECT_EQ(cudaMemset(out, 0xff, std::max<size_t>(1, p.q.size()) * 2), cudaSuccess);
    cache.k = k;
    cache.v = v;
    cache.num_blocks = p.num_blocks;
    cache.block_size = p.block_size;
    cache.kv_heads = kKvHeads;
    cache.head_dim = kHeadDim;
    batch.block_tables = tables;
    batch.max_blocks_per_seq = p.max_blocks;
    batch.seq_lens = seq_lens;
    batch.q_start = q_start;
    batch.batch = static_cast<int>(p.seq_lens.size());
    batch.total_q = p.total_q;
    batch.max_seq_len =
        std::max(max_seq_len, *std::max_element(p.seq_lens.begin(), p.seq_lens.end()));
    batch.max_q_per_seq = *std::max_element(p.n.begin(), p.n.end());
    ws_bytes = cuda::AttentionWorkspaceBytes(batch, kQHeads, kHeadDim);
    if (ws_bytes > 0) {
      EXPECT_EQ(cudaMalloc(&ws, ws_bytes), cudaSuccess);
      EXPECT_EQ(cudaMemset(ws, 0, ws_bytes), cudaSuccess);  // the counters start at zero
    }
  }
  ~DeviceProblem() {
    for (void* x :
         {static_cast<void*>(k), static_cast<void*>(v), static_cast<void*>(q),
          static_cast<void*>(out), static_cast<void*>(tables), static_cast<void*>(seq_lens),
          static_cast<void*>(q_start), static_cast<void*>(sinks), ws})
      cudaFree(x);
  }
  cudaError_t Launch(int window, cudaStream_t stream) {
    return cuda::LaunchAttention(q, cache, batch, kQHeads, sinks, window, kAttentionScale, out, ws,
                                 ws_bytes, stream, prefill_wgmma);
  }
};

void ExpectClose(const std::vector<uint16_t>& got, const std::vector<float>& ref,
                 const char* what) {
  ASSERT_EQ(got.size(), ref.size());
  float max_ref = 0.f;
  for (float r : ref) max_ref = std::max(max_ref, std::fabs(r));
  double max_err = 0;
  size_t bad = 0, first_bad = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const float g = Bf16ToFloat(got[i]);
    const float err = std::fabs(g - ref[i]);
    const float tol = 1e-2f * max_ref + 1e-2f * std::fabs(ref[i]);
    if (!(err <= tol)) {
      if (bad == 0) first_bad = i;
      ++bad;
    }
    if (std::isfinite(err)) max_err = std::max<double>(max_err, err);
  }
  EXPECT_EQ(bad, 0u) << what << ": first bad element " << first_bad << " (token "
                     << first_bad / (kQHeads * kHeadDim) << ", head "
                     << (first_bad / kHeadDim) % kQHeads << ", dim " << first_bad % kHeadDim
                     << "): got " << Bf16ToFloat(got[first_bad]) << " want " << ref[first_bad]
                     << "; max |ref| " << max_ref;
  std::printf("%s: max |err| %.3g, max |ref| %.3g\n", what, max_err, max_ref);
}

std::vector<uint16_t> Run(const Problem& p, const char* what) {
  DeviceProblem d(p);
  EXPECT_EQ(d.Launch(p.window, nullptr), cudaSuccess) << what;
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what;
  std::vector<uint16_t> got(p.q.size());
  EXPECT_EQ(cudaMemcpy(got.data(), d.out, got.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  return got;
}

void Check(const Problem& p, const std::string& what) {
  std::vector<uint16_t> got = Run(p, what.c_str());
  ExpectClose(got, Reference(p), what.c_str());
}

const std::vector<int> kDecodeLens = {1, 17, 128, 129, 1000, 5000};

TEST_F(AttentionCudaTest, DecodeOneToken) {
  for (int bs : {16, 32})
    for (int window : {0, 128}) {
      Problem p = MakeProblem(kDecodeLens, std::vector<int>(kDecodeLens.size(), 1), bs, window,
                              100 + bs + window);
      Check(p, "decode bs=" + std::to_string(bs) + " window=" + std::to_string(window));
    }
}

TEST_F(AttentionCudaTest, DecodeSeveralTokens) {
  // Up to 4 tokens per sequence (speculative / multi-token decode) stays on
  // the split-KV path: 4 x 8 heads = 32 rows per CTA.
  for (int window : {0, 128}) {
    std::vector<int> lens = {2, 17, 128, 130, 1000, 5000};
    Problem p = MakeProblem(lens, {2, 4, 3, 4, 1, 4}, 32, window, 7 + window);
    Check(p, "decode 1..4 tokens window=" + std::to_string(window));
  }
}

// Small batches take the wide shape (2 CTAs per SM, 2 * SMs / (batch * 8) KV
// splits, the last split to finish merges in the kernel): long sequences give
// 32 splits at batch 1 (two batches of merge loads), 4 at batch 8 (short
// sequences there run unsplit).
TEST_F(AttentionCudaTest, DecodeWideManySplits) {
  for (int window : {0, 128}) {
    Problem p = MakeProblem({20000}, {1}, 16, window, 300 + window);
    Check(p, "decode batch 1 len 20000 window=" + std::to_string(window));
  }
  {
    Problem p = MakeProblem({20000}, {4}, 32, 0, 301);
    Check(p, "decode batch 1 len 20000, 4 tokens");
  }
  {
    Problem p = MakeProblem({5000, 130}, {1, 1}, 16, 0, 302);
    Check(p, "decode batch 2");
  }
  {
    Problem p =
        MakeProblem({1, 64, 65, 700, 3000, 9000, 129, 4097}, std::vector<int>(8, 1), 16, 0, 303);
    Check(p, "decode batch 8");
  }
  {
    // Not wide (96 (sequence, kv head) pairs): 4 CTAs per SM, 5 splits.
    std::vector<int> lens = {9000, 1, 300, 2000, 17, 640, 641, 5000, 64, 3333, 128, 7000};
    Problem p = MakeProblem(lens, std::vector<int>(lens.size(), 1), 16, 0, 304);
    Check(p, "decode batch 12");
  }
}

// Gives the sequences of `p` that grow past their tables the spare blocks of
// the pool (those no table holds), lowest first.
void GiveSpareBlocks(Problem& p) {
  std::vector<int32_t> used(p.num_blocks, 0);
  for (int32_t id : p.tables)
    if (id >= 0) used[id] = 1;
  int next_free = 0;
  for (size_t s = 0; s < p.seq_lens.size(); ++s) {
    int32_t* t = p.tables.data() + s * p.max_blocks;
    for (int i = 0; i * p.block_size < p.seq_lens[s]; ++i) {
      if (t[i] >= 0) continue;
      while (used[next_free]) ++next_free;
      used[next_free] = 1;
      t[i] = next_free;
    }
  }
}

// The arrival counters return to zero after every call: repeated calls on one
// workspace (with lengths that change the number of live splits) stay exact.
TEST_F(AttentionCudaTest, RepeatedCallsReuseWorkspace) {
  Problem p = MakeProblem({12000, 700}, {1, 1}, 16, 0, 400, 800);
  DeviceProblem d(p, 12000);
  const std::vector<std::vector<int>> lens = {{12000, 700}, {3000, 11999}, {1, 65}, {12000, 700}};
  for (size_t call = 0; call < lens.size(); ++call) {
    Problem c = p;
    c.seq_lens = lens[call];
    ASSERT_EQ(
        cudaMemcpy(d.seq_lens, c.seq_lens.data(), 2 * sizeof(int32_t), cudaMemcpyHostToDevice),
        cudaSuccess);
    GiveSpareBlocks(c);
    ASSERT_EQ(cudaMemcpy(d.tables, c.tables.data(), c.tables.size() * 4, cudaMemcpyHostToDevice),
              cudaSuccess);
    ASSERT_EQ(d.Launch(0, nullptr), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<uint16_t> got(c.q.size());
    ASSERT_EQ(cudaMemcpy(got.data(), d.out, got.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    ExpectClose(got, Reference(c), ("repeated call " + std::to_string(call)).c_str());
  }
}

// The prefill cases run on both tensor-core paths, and with a host bound on
// the lengths past 4,096 (128-row CTAs where there is no window).
struct PrefillPath {
  bool wgmma;
  int max_seq_len;
  std::string Name() const {
    return std::string(wgmma ? " wgmma" : " mma.sync") + (max_seq_len > 0 ? " 128-row" : "");
  }
};
const PrefillPath kPrefillPaths[] = {{true, 0}, {true, 5000}, {false, 0}, {false, 5000}};

void CheckPrefill(Problem p, const std::string& what) {
  for (const PrefillPath& path : kPrefillPaths) {
    p.prefill_wgmma = path.wgmma;
    p.max_seq_len = path.max_seq_len;
    Check(p, what + path.Name());
  }
}

TEST_F(AttentionCudaTest, PrefillSingleSequence) {
  for (int window : {0, 128})
    for (int n : {5, 63, 64, 65, 129, 600}) {
      Problem p = MakeProblem({n}, {n}, 16, window, 1000 + n + window);
      CheckPrefill(p, "prefill n=" + std::to_string(n) + " window=" + std::to_string(window));
    }
}

TEST_F(AttentionCudaTest, ChunkedPrefillWithCachedPrefix) {
  for (int window : {0, 128})
    for (int bs : {16, 32}) {
      Problem p = MakeProblem({500}, {200}, bs, window, 77 + bs + window);
      CheckPrefill(p, "chunked prefill 300+200 bs=" + std::to_string(bs) +
                          " window=" + std::to_string(window));
    }
}

TEST_F(AttentionCudaTest, MixedPrefillAndDecodeBatch) {
  for (int window : {0, 128}) {
    Problem p =
        MakeProblem({600, 777, 500, 64, 300, 1}, {600, 1, 37, 64, 65, 1}, 16, window, 5 + window);
    CheckPrefill(p, "mixed batch window=" + std::to_string(window));
  }
}

TEST_F(AttentionCudaTest, GraphReplayWithChangedSeqLens) {
  // Capture a decode step sized for max_seq_len 6000, then change the
  // sequence lengths (and block tables) on the device and replay.
  Problem a = MakeProblem({5000, 3000, 40, 6000}, {1, 1, 1, 1}, 16, 0, 31, 400);
  DeviceProblem d(a, 6000);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  ASSERT_EQ(d.Launch(0, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  std::vector<uint16_t> got(a.q.size());
  ASSERT_EQ(cudaMemcpy(got.data(), d.out, got.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  ExpectClose(got, Reference(a), "graph replay, first lengths");

  // New lengths over the same cache: each sequence keeps a prefix of its table.
  Problem b = a;
  b.seq_lens = {17, 5999, 2500, 1};
  ASSERT_EQ(cudaMemcpy(d.seq_lens, b.seq_lens.data(), 4 * sizeof(int32_t), cudaMemcpyHostToDevice),
            cudaSuccess);
  GiveSpareBlocks(b);
  ASSERT_EQ(cudaMemcpy(d.tables, b.tables.data(), b.tables.size() * 4, cudaMemcpyHostToDevice),
            cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(got.data(), d.out, got.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  ExpectClose(got, Reference(b), "graph replay, changed lengths");
  // Replays reuse the workspace's counters: again, twice.
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(cudaMemset(d.out, 0xff, got.size() * 2), cudaSuccess);
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  }
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(got.data(), d.out, got.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  ExpectClose(got, Reference(b), "graph replay, third replay");
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace flotilla::kernels
