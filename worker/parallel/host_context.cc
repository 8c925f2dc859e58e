#include "worker/parallel/host_context.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace flotilla::parallel {
namespace {

// Moves bytes inside this rank's TP group only. The communicator spans the
// world, so the exchange is one AllToAllV with zero counts for every rank
// outside the group (every rank of the instance calls it in lockstep).
class GroupExchange {
 public:
  GroupExchange(comm::Communicator* comm, const ParallelConfig& config)
      : comm_(comm),
        first_(config.leader_of_group(config.dp_group_of(comm->rank()))),
        tp_(config.tp_size()) {}

  // Sends `bytes_out` of `data` to every other rank of the group and gathers
  // every rank's part (bytes_in[r] from TP rank r, own part included) into
  // `gathered`, packed in TP-rank order; offsets() gives where each begins.
  absl::Status Run(const void* data, size_t bytes_out, const std::vector<size_t>& bytes_in,
                   std::vector<char>* gathered) {
    const int world = comm_->size();
    std::vector<size_t> send_counts(world, 0), send_offsets(world, 0), recv_counts(world, 0),
        recv_offsets(world, 0);
    offsets_.assign(tp_, 0);
    size_t total = 0;
    for (int r = 0; r < tp_; ++r) {
      offsets_[r] = total;
      total += bytes_in[r];
    }
    gathered->resize(total);
    for (int r = 0; r < tp_; ++r) {
      const int peer = first_ + r;
      if (peer == comm_->rank()) {
        if (bytes_out > 0) std::memcpy(gathered->data() + offsets_[r], data, bytes_out);
        continue;
      }
      send_counts[peer] = bytes_out;
      recv_counts[peer] = bytes_in[r];
      recv_offsets[peer] = offsets_[r];
    }
    return comm_->AllToAllV(data, send_counts, send_offsets, gathered->data(), recv_counts,
                            recv_offsets);
  }

  const std::vector<size_t>& offsets() const { return offsets_; }

 private:
  comm::Communicator* comm_;
  int first_;  // world rank of TP rank 0 of this group
  int tp_;
  std::vector<size_t> offsets_;
};

class HostTensorParallel final : public TensorParallel {
 public:
  HostTensorParallel(comm::Communicator* comm, const ParallelConfig& config)
      : group_(comm, config), size_(config.tp_size()), rank_(config.tp_rank_of(comm->rank())) {}

  int size() const override { return size_; }
  int rank() const override { return rank_; }

  absl::Status AllReduce(float* data, int64_t count, void* /*stream*/) override {
    if (size_ == 1) return absl::OkStatus();
    if (count < 0 || (data == nullptr && count > 0)) {
      return absl::InvalidArgumentError("tp AllReduce: bad buffer");
    }
    const size_t bytes = count * sizeof(float);
    FLOTILLA_RETURN_IF_ERROR(
        group_.Run(data, bytes, std::vector<size_t>(size_, bytes), &gathered_));
    // Sum in TP-rank order so every rank of the group gets the same bits.
    const float* parts = reinterpret_cast<const float*>(gathered_.data());
    for (int64_t i = 0; i < count; ++i) {
      float sum = 0.0f;
      for (int r = 0; r < size_; ++r) sum += parts[r * count + i];
      data[i] = sum;
    }
    return absl::OkStatus();
  }

  absl::Status AllReduceAdd(float* part, float* residual, int64_t count, void* stream) override {
    if (count > 0 && residual == nullptr) {
      return absl::InvalidArgumentError("tp AllReduceAdd: no residual");
    }
    FLOTILLA_RETURN_IF_ERROR(AllReduce(part, count, stream));
    for (int64_t i = 0; i < count; ++i) {
      residual[i] += part[i];
      part[i] = 0.0f;
    }
    return absl::OkStatus();
  }

 private:
  GroupExchange group_;
  int size_;
  int rank_;
  std::vector<char> gathered_;
};

// One (token, k) pair this rank sent in Dispatch.
struct SentPair {
  int64_t token;
  int k;
};

class HostExpertParallel final : public ExpertParallel {
 public:
  HostExpertParallel(comm::Communicator* comm, const ParallelConfig& config,
                     const ParallelContext* context)
      : comm_(comm),
        context_(context),
        group_(comm, config),
        tp_(config.tp_size()),
        tp_rank_(config.tp_rank_of(comm->rank())),
        hidden_(context->options().hidden),
        top_k_(context->options().top_k) {}

  void SetStepTokens(int64_t /*max_tokens_any_rank*/) override {}

  absl::StatusOr<ExpertRows> Dispatch(int layer, const void* x, const int32_t* topk_ids,
                                      const float* topk_w, int64_t tokens,
                                      void* /*stream*/) override;
  absl::Status Combine(int layer, float* y, void* /*stream*/) override;

 private:
  // Bytes of one dispatched entry: the expert's slot on the receiver, then the row.
  size_t EntryBytes() const { return sizeof(int32_t) + RowBytes(); }
  size_t RowBytes() const { return hidden_ * sizeof(float); }
  // Tokens of the last Dispatch this rank dispatches (t % tp == tp_rank).
  int64_t ShareOf(int tp_rank) const {
    return tokens_ > tp_rank ? (tokens_ - tp_rank + tp_ - 1) / tp_ : 0;
  }

  absl::Status CheckDispatch(int layer, const void* x, const int32_t* topk_ids, const float* topk_w,
                             int64_t tokens) const;
  // Fills sent_ (per destination) and send_ from this rank's share.
  void PackShare(int layer, const float* x, const int32_t* topk_ids);
  // Unpacks recv_ into the rows handed to the experts.
  ExpertRows UnpackReceived();
  // y[t] for this rank's share from the outputs that came back.
  void CombineShare(float* y) const;
  // Copies the other TP ranks' shares of y into y.
  absl::Status ShareInGroup(float* y);

  comm::Communicator* comm_;
  const ParallelContext* context_;  // owns this object; holds the expert map
  GroupExchange group_;
  const int tp_, tp_rank_, hidden_, top_k_;

  // State of the last Dispatch, used by its Combine.
  int64_t tokens_ = 0;
  int layer_ = -1;
  std::vector<int32_t> ids_;  // this rank's share of topk ids and weights
  std::vector<float> weights_;
  std::vector<std::vector<SentPair>> sent_;  // per destination, in send order
  std::vector<size_t> send_counts_, send_offsets_, recv_counts_, recv_offsets_;

  // Workspaces reused across layers and steps.
  std::vector<char> send_, recv_, back_, gathered_;
  std::vector<float> rows_, out_, ones_, mine_;
  std::vector<int32_t> slots_;
  std::vector<uint32_t> turn_;  // [layer * E + expert]: the next replica's turn
};

absl::Status HostExpertParallel::CheckDispatch(int layer, const void* x, const int32_t* topk_ids,
                                               const float* topk_w, int64_t tokens) const {
  const ExpertMap& map = context_->expert_map();
  if (layer < 0 || layer >= map.num_layers()) {
    return absl::InvalidArgumentError(absl::StrCat("ep Dispatch: no layer ", layer));
  }
  if (tokens < 0 || (tokens > 0 && (x == nullptr || topk_ids == nullptr || topk_w == nullptr))) {
    return absl::InvalidArgumentError("ep Dispatch: missing buffers");
  }
  for (int64_t t = tp_rank_; t < tokens; t += tp_) {
    for (int j = 0; j < top_k_; ++j) {
      const int32_t e = topk_ids[t * top_k_ + j];
      if (e < 0 || e >= map.num_experts()) {
        return absl::InvalidArgumentError(
            absl::StrCat("ep Dispatch: layer ", layer, " token ", t, ": no expert ", e));
      }
    }
  }
  return absl::OkStatus();
}

void HostExpertParallel::PackShare(int layer, const float* x, const int32_t* topk_ids) {
  const ExpertMap& map = context_->expert_map();
  const int world = comm_->size();
  const size_t entry = EntryBytes(), row = RowBytes();
  sent_.assign(world, {});
  std::vector<std::vector<int32_t>> slot_of(world);
  const int E = map.num_experts();
  if (turn_.size() != static_cast<size_t>(map.num_layers()) * E) {
    // Senders start at different replicas so their first rows spread too.
    turn_.assign(static_cast<size_t>(map.num_layers()) * E, static_cast<uint32_t>(comm_->rank()));
  }
  for (int64_t t = tp_rank_; t < tokens_; t += tp_) {
    for (int j = 0; j < top_k_; ++j) {
      const int expert = topk_ids[t * top_k_ + j];
      const auto& replicas = map.replicas(layer, expert);
      // Replicas of an expert take turns per row this rank sends: a hot
      // expert's rows spread evenly over its copies even at batch 1, and
      // every copy holds the same weights, so the choice never changes the
      // result.
      const ExpertLocation& at = replicas[turn_[layer * E + expert]++ % replicas.size()];
      sent_[at.rank].push_back({t, j});
      slot_of[at.rank].push_back(at.slot);
    }
  }
  send_counts_.assign(world, 0);
  send_offsets_.assign(world, 0);
  size_t total = 0;
  for (int d = 0; d < world; ++d) {
    send_offsets_[d] = total;
    send_counts_[d] = sent_[d].size() * entry;
    total += send_counts_[d];
  }
  send_.resize(total);
  for (int d = 0; d < world; ++d) {
    char* p = send_.data() + send_offsets_[d];
    for (size_t i = 0; i < sent_[d].size(); ++i, p += entry) {
      std::memcpy(p, &slot_of[d][i], sizeof(int32_t));
      std::memcpy(p + sizeof(int32_t), x + sent_[d][i].token * hidden_, row);
    }
  }
}

ExpertRows HostExpertParallel::UnpackReceived() {
  const size_t entry = EntryBytes(), row = RowBytes();
  const int64_t n = static_cast<int64_t>(recv_.size() / entry);
  rows_.resize(n * hidden_);
  slots_.resize(n);
  for (int64_t i = 0; i < n; ++i) {
    const char* p = recv_.data() + i * entry;
    std::memcpy(&slots_[i], p, sizeof(int32_t));
    std::memcpy(&rows_[i * hidden_], p + sizeof(int32_t), row);
  }
  ones_.assign(n, 1.0f);
  out_.assign(n * hidden_, 0.0f);
  ExpertRows rows;
  rows.x = rows_.data();
  rows.slot = slots_.data();
  rows.ones = ones_.data();
  rows.rows = n;
  rows.out = out_.data();
  return rows;
}

absl::StatusOr<ExpertRows> HostExpertParallel::Dispatch(int layer, const void* x,
                                                        const int32_t* topk_ids,
                                                        const float* topk_w, int64_t tokens,
                                                        void* /*stream*/) {
  FLOTILLA_RETURN_IF_ERROR(CheckDispatch(layer, x, topk_ids, topk_w, tokens));
  layer_ = layer;
  tokens_ = tokens;
  ids_.clear();
  weights_.clear();
  for (int64_t t = tp_rank_; t < tokens; t += tp_) {
    ids_.insert(ids_.end(), topk_ids + t * top_k_, topk_ids + (t + 1) * top_k_);
    weights_.insert(weights_.end(), topk_w + t * top_k_, topk_w + (t + 1) * top_k_);
  }
  PackShare(layer, static_cast<const float*>(x), topk_ids);

  const int world = comm_->size();
  const size_t entry = EntryBytes();
  recv_counts_.assign(world, 0);
  FLOTILLA_RETURN_IF_ERROR(comm_->ExchangeCounts(send_counts_, absl::MakeSpan(recv_counts_)));
  recv_offsets_.assign(world, 0);
  size_t total = 0;
  for (int p = 0; p < world; ++p) {
    if (recv_counts_[p] % entry != 0) {
      return absl::InternalError(absl::StrCat("ep Dispatch: layer ", layer, ": rank ", p, " sent ",
                                              recv_counts_[p], " bytes, not whole rows"));
    }
    recv_offsets_[p] = total;
    total += recv_counts_[p];
  }
  recv_.resize(total);
  FLOTILLA_RETURN_IF_ERROR(comm_->AllToAllV(send_.data(), send_counts_, send_offsets_, recv_.data(),
                                            recv_counts_, recv_offsets_));
  return UnpackReceived();
}

void HostExpertParallel::CombineShare(float* y) const {
  const size_t entry = EntryBytes(), row = RowBytes();
  // Where the output of each (share index, k) pair came back.
  std::vector<const float*> result(ids_.size(), nullptr);
  size_t offset = 0;
  for (size_t d = 0; d < sent_.size(); ++d) {
    const float* base = reinterpret_cast<const float*>(back_.data() + offset);
    for (size_t i = 0; i < sent_[d].size(); ++i) {
      const SentPair& pair = sent_[d][i];
      result[(pair.token / tp_) * top_k_ + pair.k] = base + i * hidden_;
    }
    offset += send_counts_[d] / entry * row;
  }
  // Ascending expert id with `+= out * w` from zero: the single-rank
  // engine's order and arithmetic, so the sum is the same bits.
  std::vector<int> order(top_k_);
  for (int64_t i = 0; i < ShareOf(tp_rank_); ++i) {
    const int32_t* ids = &ids_[i * top_k_];
    for (int j = 0; j < top_k_; ++j) order[j] = j;
    std::sort(order.begin(), order.end(), [&](int a, int b) { return ids[a] < ids[b]; });
    float* yr = y + (i * tp_ + tp_rank_) * hidden_;
    std::fill(yr, yr + hidden_, 0.0f);
    for (int j : order) {
      const float w = weights_[i * top_k_ + j];
      const float* out = result[i * top_k_ + j];
      for (int h = 0; h < hidden_; ++h) yr[h] += out[h] * w;
    }
  }
}

absl::Status HostExpertParallel::ShareInGroup(float* y) {
  if (tp_ == 1) return absl::OkStatus();
  const size_t row = RowBytes();
  mine_.resize(ShareOf(tp_rank_) * hidden_);
  for (int64_t i = 0; i < ShareOf(tp_rank_); ++i) {
    std::memcpy(&mine_[i * hidden_], y + (i * tp_ + tp_rank_) * hidden_, row);
  }
  std::vector<size_t> bytes_in(tp_);
  for (int r = 0; r < tp_; ++r) bytes_in[r] = ShareOf(r) * row;
  FLOTILLA_RETURN_IF_ERROR(
      group_.Run(mine_.data(), mine_.size() * sizeof(float), bytes_in, &gathered_));
  for (int r = 0; r < tp_; ++r) {
    if (r == tp_rank_) continue;
    const float* part = reinterpret_cast<const float*>(gathered_.data() + group_.offsets()[r]);
    for (int64_t i = 0; i < ShareOf(r); ++i) {
      std::memcpy(y + (i * tp_ + r) * hidden_, part + i * hidden_, row);
    }
  }
  return absl::OkStatus();
}

absl::Status HostExpertParallel::Combine(int layer, float* y, void* /*stream*/) {
  if (layer != layer_) {
    return absl::FailedPreconditionError(
        absl::StrCat("ep Combine: layer ", layer, " after a Dispatch of layer ", layer_));
  }
  if (y == nullptr && tokens_ > 0) return absl::InvalidArgumentError("ep Combine: no output");
  layer_ = -1;
  // The reverse of Dispatch: every rank knows both sides' counts.
  const int world = comm_->size();
  const size_t entry = EntryBytes(), row = RowBytes();
  std::vector<size_t> send_counts(world), send_offsets(world), recv_counts(world),
      recv_offsets(world);
  size_t total = 0;
  for (int p = 0; p < world; ++p) {
    send_counts[p] = recv_counts_[p] / entry * row;
    send_offsets[p] = recv_offsets_[p] / entry * row;
    recv_counts[p] = send_counts_[p] / entry * row;
    recv_offsets[p] = total;
    total += recv_counts[p];
  }
  back_.resize(total);
  FLOTILLA_RETURN_IF_ERROR(comm_->AllToAllV(out_.data(), send_counts, send_offsets, back_.data(),
                                            recv_counts, recv_offsets));
  CombineShare(y);
  return ShareInGroup(y);
}

class HostContext final : public ParallelContext {
 public:
  HostContext(const ParallelConfig& config, ExpertMap map, comm::Communicator* comm,
              const ContextOptions& options)
      : ParallelContext(config, std::move(map), comm->rank(), options),
        tp_(comm, config),
        ep_(comm, config, this) {}

  TensorParallel& tp() override { return tp_; }
  ExpertParallel& ep() override { return ep_; }
  std::string backend() const override { return "host"; }

 private:
  HostTensorParallel tp_;
  HostExpertParallel ep_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<ParallelContext>> CreateHostContext(const ParallelConfig& config,
                                                                   ExpertMap map,
                                                                   comm::Communicator* comm,
                                                                   const ContextOptions& options) {
  if (comm == nullptr || comm->size() != config.world_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "host context: the communicator must span the instance's ", config.world_size(), " ranks"));
  }
  if (map.world_size() != config.world_size() || map.num_layers() == 0) {
    return absl::InvalidArgumentError(absl::StrCat("host context: the expert map is for ",
                                                   map.world_size(), " ranks, the instance has ",
                                                   config.world_size()));
  }
  if (options.memory != Memory::kHost || options.hidden <= 0 || options.top_k <= 0 ||
      options.top_k > map.num_experts()) {
    return absl::InvalidArgumentError(
        "host context: needs host memory, hidden > 0 and 0 < top_k <= experts");
  }
  return std::make_unique<HostContext>(config, std::move(map), comm, options);
}

}  // namespace flotilla::parallel
