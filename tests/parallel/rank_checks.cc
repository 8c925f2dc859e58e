#include "tests/parallel/rank_checks.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/bf16.h"
#include "common/status.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/ep_exchange.h"
#include "kernels/cuda/ops.h"
#include "tests/parallel/fake_experts.h"

namespace flotilla::parallel::testing {
namespace {

absl::Status Cuda(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(err)));
}

// A device array owned by one check.
template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(size_t n) : n_(std::max<size_t>(n, 1)) {
    if (cudaMalloc(&p_, n_ * sizeof(T)) != cudaSuccess) p_ = nullptr;
  }
  ~DeviceArray() { cudaFree(p_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  T* get() const { return p_; }
  absl::Status Put(const std::vector<T>& h) {
    if (p_ == nullptr || h.size() > n_) return absl::InternalError("device array too small");
    FLOTILLA_RETURN_IF_ERROR(
        Cuda(cudaMemcpy(p_, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), "put"));
    // From pageable memory the copy may return before it landed, and the
    // contexts' kernels run on non-blocking streams that do not wait for it.
    return Cuda(cudaDeviceSynchronize(), "put");
  }

 private:
  size_t n_;
  T* p_ = nullptr;
};

template <typename T>
absl::StatusOr<std::vector<T>> Get(const T* device, size_t n) {
  std::vector<T> h(n);
  if (n == 0) return h;
  FLOTILLA_RETURN_IF_ERROR(
      Cuda(cudaMemcpy(h.data(), device, n * sizeof(T), cudaMemcpyDeviceToHost), "get"));
  return h;
}

// What `enqueue` puts on `stream`, captured into an instantiated graph.
absl::StatusOr<cudaGraphExec_t> CaptureGraph(cudaStream_t stream,
                                             const std::function<absl::Status()>& enqueue) {
  cudaGraph_t graph = nullptr;
  FLOTILLA_RETURN_IF_ERROR(
      Cuda(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "begin capture"));
  const absl::Status captured = enqueue();
  FLOTILLA_RETURN_IF_ERROR(Cuda(cudaStreamEndCapture(stream, &graph), "end capture"));
  FLOTILLA_RETURN_IF_ERROR(captured);
  cudaGraphExec_t exec = nullptr;
  const cudaError_t err = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  FLOTILLA_RETURN_IF_ERROR(Cuda(err, "instantiate"));
  return exec;
}

// Equal as floats (so +0 == -0), with the first difference in the message.
absl::Status SameFloats(const std::vector<float>& got, const std::vector<float>& want,
                        const std::string& what, float tolerance = 0) {
  if (got.size() != want.size()) {
    return absl::InternalError(
        absl::StrCat(what, ": ", got.size(), " values, expected ", want.size()));
  }
  for (size_t i = 0; i < got.size(); ++i) {
    if (!(std::fabs(got[i] - want[i]) <= tolerance)) {
      return absl::InternalError(absl::StrCat(what, ": element ", i, " is ", got[i], ", expected ",
                                              want[i], " (within ", tolerance, ")"));
    }
  }
  return absl::OkStatus();
}

// The TP all-reduce against its TP-rank-order sums. Two terms add the same
// either way; beyond TP 2 NCCL adds in an order of its own, so an element may
// differ by the rounding of tp - 1 additions of partial sums within [-tp, tp]
// (the inputs are in [-1, 1]).
absl::Status SameReduce(const Scenario& s, const std::vector<float>& got,
                        const std::vector<float>& want, const std::string& what) {
  const float tolerance =
      s.tp <= 2 ? 0.f : static_cast<float>(s.tp * s.tp) * std::numeric_limits<float>::epsilon();
  return SameFloats(got, want, what, tolerance);
}

// Device copies of the group's inputs and this rank's outputs.
struct StepBuffers {
  explicit StepBuffers(const Scenario& s)
      : x(static_cast<size_t>(s.max_tokens) * s.hidden),
        ids(static_cast<size_t>(s.max_tokens) * s.top_k),
        w(static_cast<size_t>(s.max_tokens) * s.top_k),
        y(static_cast<size_t>(s.max_tokens) * s.hidden) {}
  absl::Status Put(const GroupData& d) {
    FLOTILLA_RETURN_IF_ERROR(x.Put(d.x));
    FLOTILLA_RETURN_IF_ERROR(ids.Put(d.ids));
    return w.Put(d.w);
  }
  DeviceArray<uint16_t> x;
  DeviceArray<int32_t> ids;
  DeviceArray<float> w;
  DeviceArray<float> y;
};

// The slot -> expert tables of every layer for this rank.
struct SlotTables {
  SlotTables(const ExpertMap& map, int rank) {
    for (int l = 0; l < map.num_layers(); ++l) {
      host.push_back(ExpertOfSlot(map, l, rank));
      device.emplace_back(std::make_unique<DeviceArray<int32_t>>(host.back().size()));
      status.Update(device.back()->Put(host.back()));
    }
  }
  std::vector<std::vector<int32_t>> host;
  std::vector<std::unique_ptr<DeviceArray<int32_t>>> device;
  absl::Status status;
};

std::vector<GroupData> AllGroups(const Scenario& s, uint64_t step, int layer,
                                 const std::vector<int>& tokens) {
  std::vector<GroupData> groups;
  for (size_t g = 0; g < tokens.size(); ++g) {
    groups.push_back(MakeGroupData(s, step, layer, static_cast<int>(g), tokens[g]));
  }
  return groups;
}

// One segment of the received rows against what its source must have sent.
absl::Status CheckSegment(const Scenario& s, int source, int cap,
                          const std::vector<ExpectedRow>& want, const GroupData& from,
                          const std::vector<int32_t>& slot, const std::vector<float>& ones,
                          const std::vector<uint16_t>& x, const std::vector<float>& out) {
  if (static_cast<int>(want.size()) > cap) {
    return absl::InternalError(absl::StrCat("source ", source, " sends more than cap ", cap));
  }
  for (int i = 0; i < cap; ++i) {
    const size_t r = static_cast<size_t>(source) * cap + i;
    const bool real = i < static_cast<int>(want.size());
    const int want_slot = real ? want[i].slot : -1;
    if (slot[r] != want_slot || ones[r] != (real ? 1.f : 0.f)) {
      return absl::InternalError(absl::StrCat("row ", i, " from rank ", source, ": slot ", slot[r],
                                              " ones ", ones[r], ", expected slot ", want_slot));
    }
    if (!real) continue;
    const size_t h = static_cast<size_t>(s.hidden);
    if (!std::equal(x.begin() + r * h, x.begin() + (r + 1) * h,
                    from.x.begin() + static_cast<size_t>(want[i].token) * h)) {
      return absl::InternalError(
          absl::StrCat("row ", i, " from rank ", source, ": not token ", want[i].token, "'s x"));
    }
    if (std::any_of(out.begin() + r * h, out.begin() + (r + 1) * h,
                    [](float v) { return v != 0.f; })) {
      return absl::InternalError(absl::StrCat("out row ", r, " was not zeroed"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckRows(const Scenario& s, const ExpertMap& map, int layer, int rank,
                       const ExpertRows& rows, int64_t step_tokens,
                       const std::vector<GroupData>& groups) {
  const int cap = static_cast<int>((step_tokens + s.tp - 1) / s.tp * s.top_k);
  if (rows.rows != static_cast<int64_t>(s.world) * cap) {
    return absl::InternalError(
        absl::StrCat("ExpertRows::rows is ", rows.rows, ", expected ", s.world * cap));
  }
  const size_t n = static_cast<size_t>(rows.rows), h = static_cast<size_t>(s.hidden);
  FLOTILLA_ASSIGN_OR_RETURN(auto slot, Get(rows.slot, n));
  FLOTILLA_ASSIGN_OR_RETURN(auto ones, Get(rows.ones, n));
  FLOTILLA_ASSIGN_OR_RETURN(auto x, Get(static_cast<const uint16_t*>(rows.x), n * h));
  FLOTILLA_ASSIGN_OR_RETURN(auto out, Get(rows.out, n * h));
  const auto want = ExpectedRows(s, map, layer, rank, groups);
  for (int p = 0; p < s.world; ++p) {
    FLOTILLA_RETURN_IF_ERROR(
        CheckSegment(s, p, cap, want[p], groups[p / s.tp], slot, ones, x, out));
  }
  return absl::OkStatus();
}

// The fake experts over the rows of `layer`, as an engine runs its MoE kernel.
absl::Status RunFakeExperts(const ExpertRows& rows, const SlotTables& tables, int layer, int hidden,
                            cudaStream_t stream) {
  const auto& table = tables.host[static_cast<size_t>(layer)];
  return Cuda(LaunchFakeExperts(static_cast<const uint16_t*>(rows.x), rows.slot, rows.ones,
                                rows.rows, hidden, tables.device[static_cast<size_t>(layer)]->get(),
                                static_cast<int>(table.size()), rows.out, stream),
              "fake experts");
}

}  // namespace

absl::Status CheckSteps(const Scenario& s, ParallelContext& c, int steps, cudaStream_t stream) {
  const int rank = c.rank(), group = rank / s.tp;
  StepBuffers b(s);
  SlotTables tables(c.expert_map(), rank);
  FLOTILLA_RETURN_IF_ERROR(tables.status);
  for (int step = 0; step < steps; ++step) {
    std::vector<int> tokens;
    for (int g = 0; g < s.world / s.tp; ++g) tokens.push_back(GroupTokens(s, step, g));
    const int step_tokens = *std::max_element(tokens.begin(), tokens.end());
    c.ep().SetStepTokens(step_tokens);
    for (int layer = 0; layer < s.layers; ++layer) {
      const std::vector<GroupData> groups = AllGroups(s, step, layer, tokens);
      const GroupData& mine = groups[static_cast<size_t>(group)];
      FLOTILLA_RETURN_IF_ERROR(b.Put(mine));
      const std::string where = absl::StrCat("step ", step, " layer ", layer, " (", mine.tokens,
                                             " tokens of ", step_tokens, "): ");
      FLOTILLA_ASSIGN_OR_RETURN(ExpertRows rows, c.ep().Dispatch(layer, b.x.get(), b.ids.get(),
                                                                 b.w.get(), mine.tokens, stream));
      FLOTILLA_RETURN_IF_ERROR(Cuda(cudaStreamSynchronize(stream), "dispatch"));
      if (absl::Status st = CheckRows(s, c.expert_map(), layer, rank, rows, step_tokens, groups);
          !st.ok()) {
        return absl::InternalError(absl::StrCat(where, "dispatch: ", st.message()));
      }
      FLOTILLA_RETURN_IF_ERROR(RunFakeExperts(rows, tables, layer, s.hidden, stream));
      FLOTILLA_RETURN_IF_ERROR(c.ep().Combine(layer, b.y.get(), stream));
      FLOTILLA_RETURN_IF_ERROR(Cuda(cudaStreamSynchronize(stream), "combine"));
      FLOTILLA_ASSIGN_OR_RETURN(auto y,
                                Get(b.y.get(), static_cast<size_t>(mine.tokens) * s.hidden));
      FLOTILLA_RETURN_IF_ERROR(SameFloats(y, ExpectedY(s, mine), where + "combine y"));
    }
  }
  return c.CheckHealth();
}

// residual + the group's sum of `part`, and `part` zero afterwards.
absl::Status CheckAllReduceAdd(const Scenario& s, ParallelContext& c, int64_t count,
                               DeviceArray<float>& part, DeviceArray<float>& residual,
                               cudaStream_t stream) {
  const uint64_t seed = static_cast<uint64_t>(count) + 17;
  const std::vector<float> before = ReduceInput(seed + 1, c.rank(), count);
  FLOTILLA_RETURN_IF_ERROR(part.Put(ReduceInput(seed, c.rank(), count)));
  FLOTILLA_RETURN_IF_ERROR(residual.Put(before));
  FLOTILLA_RETURN_IF_ERROR(c.tp().AllReduceAdd(part.get(), residual.get(), count, stream));
  FLOTILLA_RETURN_IF_ERROR(Cuda(cudaStreamSynchronize(stream), "all-reduce add"));
  FLOTILLA_ASSIGN_OR_RETURN(auto got, Get(residual.get(), static_cast<size_t>(count)));
  FLOTILLA_ASSIGN_OR_RETURN(auto left, Get(part.get(), static_cast<size_t>(count)));
  std::vector<float> want = ExpectedReduce(s, seed, c.rank(), count);
  for (size_t i = 0; i < want.size(); ++i) want[i] = SyntheticAdd(before[i], want[i]);
  const std::string what = absl::StrCat("all-reduce add of ", count);
  FLOTILLA_RETURN_IF_ERROR(SameReduce(s, got, want, what));
  return SameFloats(left, std::vector<float>(left.size(), 0.f), what + ": the part left");
}

absl::Status CheckAllReduces(const Scenario& s, ParallelContext& c, cudaStream_t stream) {
  // Odd counts and those past the flagged lines' bound go in rounds; even
  // ones up to max_tokens * hidden as flagged lines.
  const int64_t full = s.max_tokens * s.hidden;
  const int64_t counts[] = {0, 1, 2, 7, 8, 2 * s.hidden, 5 * s.hidden + 3, full, 300001};
  DeviceArray<float> data(300001);
  DeviceArray<float> residual(300001);
  for (int64_t count : counts) {
    const uint64_t seed = static_cast<uint64_t>(count);
    FLOTILLA_RETURN_IF_ERROR(data.Put(ReduceInput(seed, c.rank(), count)));
    FLOTILLA_RETURN_IF_ERROR(c.tp().AllReduce(data.get(), count, stream));
    FLOTILLA_RETURN_IF_ERROR(Cuda(cudaStreamSynchronize(stream), "all-reduce"));
    FLOTILLA_ASSIGN_OR_RETURN(auto got, Get(data.get(), static_cast<size_t>(count)));
    FLOTILLA_RETURN_IF_ERROR(SameReduce(s, got, ExpectedReduce(s, seed, c.rank(), count),
                                        absl::StrCat("all-reduce of ", count)));
  }
  for (int64_t count : {int64_t{2}, int64_t{s.hidden}, full, int64_t{300000}, int64_t{7}}) {
    FLOTILLA_RETURN_IF_ERROR(CheckAllReduceAdd(s, c, count, data, residual, stream));
  }
  return c.CheckHealth();
}

namespace {

// This rank's share of a TP projection: x [tokens, in] and w [out, in] in
// bf16, different on every rank; the bias on TP rank 0 only.
struct ProjectionShare {
  static constexpr int kIn = 256;
  ProjectionShare(const Scenario& s, int rank, int tp_rank, int tokens)
      : tokens(tokens),
        out(s.hidden),
        x(static_cast<size_t>(tokens) * kIn),
        w(static_cast<size_t>(s.hidden) * kIn),
        bias(static_cast<size_t>(s.hidden)) {
    auto bf16 = [&](uint64_t seed, size_t n) {
      std::vector<float> v = ReduceInput(seed, rank, static_cast<int64_t>(n));
      std::vector<uint16_t> h(n);
      for (size_t i = 0; i < n; ++i) h[i] = FloatToBf16(v[i]);
      return h;
    };
    status.Update(x.Put(bf16(71 + tokens, static_cast<size_t>(tokens) * kIn)));
    status.Update(w.Put(bf16(73, static_cast<size_t>(out) * kIn)));
    status.Update(bias.Put(bf16(79, static_cast<size_t>(out))));
    with_bias = tp_rank == 0;
  }
  const uint16_t* b() const { return with_bias ? bias.get() : nullptr; }
  int tokens, out;
  bool with_bias = false;
  DeviceArray<uint16_t> x, w, bias;
  absl::Status status;
};

// The projection and the all-reduce apart (`fused` false) or in one launch.
absl::Status Project(ParallelContext& c, const ProjectionShare& p, bool fused,
                     const kernels::cuda::EpLaunch& lines, float* part, float* residual,
                     cudaStream_t stream) {
  const int in = ProjectionShare::kIn;
  if (fused) {
    return Cuda(kernels::cuda::LaunchLinearTpSum(p.x.get(), p.w.get(), p.b(), p.tokens, in, p.out,
                                                 residual, lines, stream),
                "LaunchLinearTpSum");
  }
  FLOTILLA_RETURN_IF_ERROR(
      Cuda(kernels::cuda::LaunchLinear(nullptr, p.x.get(), p.w.get(), p.b(), p.tokens, in, p.out,
                                       false, part, stream),
           "LaunchLinear"));
  return c.tp().AllReduceAdd(part, residual, static_cast<int64_t>(p.tokens) * p.out, stream);
}

}  // namespace

absl::Status CheckLinearTpSum(const Scenario& s, ParallelContext& c, cudaStream_t stream) {
  kernels::cuda::EpLaunch lines;
  const bool offered = c.tp().DeviceLines(&lines);
  // Ranks of this test share GPUs when there are fewer GPUs than ranks.
  const bool expected =
      s.tp > 1 && c.backend() == "cuda-ipc" && s.world <= kernels::cuda::DeviceCount();
  if (offered != expected) {
    return absl::InternalError(absl::StrCat("DeviceLines said ", offered, " on ", c.backend(),
                                            " with TP ", s.tp, ", expected ", expected));
  }
  if (!offered) return absl::OkStatus();
  const int tp_rank = c.tp().rank();
  for (int tokens : {1, 3, 8}) {
    const std::string what = absl::StrCat("TP sum in the projection, ", tokens, " tokens");
    ProjectionShare p(s, c.rank(), tp_rank, tokens);
    FLOTILLA_RETURN_IF_ERROR(p.status);
    if (!kernels::cuda::LinearTpSumFits(lines, tokens, ProjectionShare::kIn, p.out)) {
      return absl::InternalError(what + ": does not fit the context's lines");
    }
    const size_t n = static_cast<size_t>(tokens) * p.out;
    const std::vector<float> before = ReduceInput(83, c.rank() - tp_rank, static_cast<int64_t>(n));
    DeviceArray<float> part(n), apart(n), fused(n), mixed(n);
    FLOTILLA_RETURN_IF_ERROR(part.Put(std::vector<float>(n, 0.f)));
    for (DeviceArray<float>* r : {&apart, &fused, &mixed}) FLOTILLA_RETURN_IF_ERROR(r->Put(before));
    FLOTILLA_RETURN_IF_ERROR(Project(c, p, false, lines, part.get(), apart.get(), stream));
    FLOTILLA_RETURN_IF_ERROR(Project(c, p, true, lines, part.get(), fused.get(), stream));
    FLOTILLA_RETURN_IF_ERROR(
        Project(c, p, tp_rank % 2 == 0, lines, part.get(), mixed.get(), stream));
    FLOTILLA_RETURN_IF_ERROR(Cuda(cudaStreamSynchronize(stream), "projections"));
    FLOTILLA_ASSIGN_OR_RETURN(const auto want, Get(apart.get(), n));
    FLOTILLA_ASSIGN_OR_RETURN(const auto got, Get(fused.get(), n));
    FLOTILLA_ASSIGN_OR_RETURN(const auto got_mixed, Get(mixed.get(), n));
    size_t moved = 0;
    for (size_t i = 0; i < n; ++i) moved += want[i] != before[i] ? 1 : 0;
    if (moved < n / 2) {
      return absl::InternalError(
          absl::StrCat(what, ": only ", moved, " of ", n, " residual values changed"));
    }
    FLOTILLA_RETURN_IF_ERROR(SameFloats(got, want, what));
    FLOTILLA_RETURN_IF_ERROR(SameFloats(got_mixed, want, what + ", peers mixing both forms"));
  }
  // Both forms captured once, replayed twice: the numbers keep counting.
  ProjectionShare p(s, c.rank(), tp_rank, 2);
  FLOTILLA_RETURN_IF_ERROR(p.status);
  const size_t n = static_cast<size_t>(2) * p.out;
  DeviceArray<float> part(n), apart(n), fused(n);
  FLOTILLA_RETURN_IF_ERROR(part.Put(std::vector<float>(n, 0.f)));
  FLOTILLA_RETURN_IF_ERROR(apart.Put(std::vector<float>(n, 0.f)));
  FLOTILLA_RETURN_IF_ERROR(fused.Put(std::vector<float>(n, 0.f)));
  FLOTILLA_ASSIGN_OR_RETURN(
      cudaGraphExec_t exec, CaptureGraph(stream, [&] {
        FLOTILLA_RETURN_IF_ERROR(Project(c, p, true, lines, part.get(), fused.get(), stream));
        return Project(c, p, false, lines, part.get(), apart.get(), stream);
      }));
  absl::Status replayed;
  for (int replay = 0; replay < 2 && replayed.ok(); ++replay) {
    replayed = Cuda(cudaGraphLaunch(exec, stream), "replay");
  }
  if (replayed.ok()) replayed = Cuda(cudaStreamSynchronize(stream), "replays");
  cudaGraphExecDestroy(exec);
  FLOTILLA_RETURN_IF_ERROR(replayed);
  FLOTILLA_ASSIGN_OR_RETURN(const auto want, Get(apart.get(), n));
  FLOTILLA_ASSIGN_OR_RETURN(const auto got, Get(fused.get(), n));
  FLOTILLA_RETURN_IF_ERROR(SameFloats(got, want, "TP sum in the projection, graph replays"));
  return c.CheckHealth();
}

absl::Status CheckGraphReplays(const Scenario& s, ParallelContext& c, cudaStream_t stream) {
  const int rank = c.rank(), group = rank / s.tp;
  const int64_t reduce_count = 3 * s.hidden + 1;
  const int64_t add_count = 2 * s.hidden;  // flagged lines
  StepBuffers b(s);
  DeviceArray<float> reduce(static_cast<size_t>(reduce_count));
  DeviceArray<float> part(static_cast<size_t>(add_count));
  DeviceArray<float> residual(static_cast<size_t>(add_count));
  SlotTables tables(c.expert_map(), rank);
  FLOTILLA_RETURN_IF_ERROR(tables.status);
  std::vector<int> tokens;
  for (int g = 0; g < s.world / s.tp; ++g) tokens.push_back(1 + (g * 5 + 3) % 16);
  const int step_tokens = *std::max_element(tokens.begin(), tokens.end());
  const int layer = s.layers - 1;
  c.ep().SetStepTokens(step_tokens);

  FLOTILLA_ASSIGN_OR_RETURN(
      cudaGraphExec_t exec, CaptureGraph(stream, [&]() -> absl::Status {
        FLOTILLA_ASSIGN_OR_RETURN(const ExpertRows rows,
                                  c.ep().Dispatch(layer, b.x.get(), b.ids.get(), b.w.get(),
                                                  tokens[static_cast<size_t>(group)], stream));
        FLOTILLA_RETURN_IF_ERROR(RunFakeExperts(rows, tables, layer, s.hidden, stream));
        FLOTILLA_RETURN_IF_ERROR(c.ep().Combine(layer, b.y.get(), stream));
        FLOTILLA_RETURN_IF_ERROR(c.tp().AllReduce(reduce.get(), reduce_count, stream));
        return c.tp().AllReduceAdd(part.get(), residual.get(), add_count, stream);
      }));

  absl::Status result;
  for (int replay = 0; replay < 2 && result.ok(); ++replay) {
    const uint64_t seed = 1000 + replay;
    const std::vector<GroupData> groups = AllGroups(s, seed, layer, tokens);
    const GroupData& mine = groups[static_cast<size_t>(group)];
    result.Update(b.Put(mine));
    result.Update(reduce.Put(ReduceInput(seed, rank, reduce_count)));
    const std::vector<float> before = ReduceInput(seed + 1, rank, add_count);
    result.Update(part.Put(ReduceInput(seed, rank, add_count)));
    result.Update(residual.Put(before));
    result.Update(Cuda(cudaGraphLaunch(exec, stream), "graph launch"));
    result.Update(Cuda(cudaStreamSynchronize(stream), "graph replay"));
    if (!result.ok()) break;
    auto y = Get(b.y.get(), static_cast<size_t>(mine.tokens) * s.hidden);
    auto r = Get(reduce.get(), static_cast<size_t>(reduce_count));
    result.Update(y.status());
    result.Update(r.status());
    if (!result.ok()) break;
    result.Update(SameFloats(*y, ExpectedY(s, mine), absl::StrCat("replay ", replay, " y")));
    result.Update(SameReduce(s, *r, ExpectedReduce(s, seed, rank, reduce_count),
                             absl::StrCat("replay ", replay, " all-reduce")));
    auto added = Get(residual.get(), static_cast<size_t>(add_count));
    result.Update(added.status());
    if (!result.ok()) break;
    std::vector<float> want = ExpectedReduce(s, seed, rank, add_count);
    for (size_t i = 0; i < want.size(); ++i) want[i] = SyntheticAdd(before[i], want[i]);
    result.Update(SameReduce(s, *added, want, absl::StrCat("replay ", replay, " all-reduce add")));
  }
  cudaGraphExecDestroy(exec);
  FLOTILLA_RETURN_IF_ERROR(result);
  return c.CheckHealth();
}

}  // namespace flotilla::parallel::testing
