#include "worker/distributed_collectives.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace flotilla::worker {

DistributedCollectives::DistributedCollectives(comm::Communicator* comm, ParallelConfig parallel,
                                               ExpertMap map)
    : comm_(comm), parallel_(parallel), map_(std::move(map)), rank_(comm->rank()) {}

absl::Status DistributedCollectives::ExchangeInGroup(const void* data, size_t bytes_out,
                                                     std::vector<size_t> bytes_in,
                                                     std::vector<char>* gathered,
                                                     std::vector<size_t>* offsets) {
  const int W = parallel_.world_size(), tp = parallel_.tp_size();
  const int first = parallel_.leader_of_group(parallel_.dp_group_of(rank_));
  std::vector<size_t> send_counts(W, 0), send_offsets(W, 0), recv_counts(W, 0),
      recv_offsets(W, 0);
  size_t total = 0;
  offsets->assign(tp, 0);
  for (int t = 0; t < tp; ++t) {
    (*offsets)[t] = total;
    total += bytes_in[t];
  }
  gathered->resize(total);
  for (int t = 0; t < tp; ++t) {
    const int peer = first + t;
    if (peer == rank_) {
      if (bytes_out) std::memcpy(gathered->data() + (*offsets)[t], data, bytes_out);
      continue;
    }
    send_counts[peer] = bytes_out;
    recv_counts[peer] = bytes_in[t];
    recv_offsets[peer] = (*offsets)[t];
  }
  return comm_->AllToAllV(data, send_counts, send_offsets, gathered->data(), recv_counts,
                          recv_offsets);
}

absl::Status DistributedCollectives::AllReduceAttention(int layer, float* data, int64_t count) {
  const int tp = parallel_.tp_size();
  if (tp == 1) return absl::OkStatus();
  const size_t bytes = count * sizeof(float);
  std::vector<size_t> offsets;
  FLOTILLA_RETURN_IF_ERROR(
      ExchangeInGroup(data, bytes, std::vector<size_t>(tp, bytes), &gathered_, &offsets));
  // Sum in TP-rank order so every rank of the group gets the same bits.
  const float* parts = reinterpret_cast<const float*>(gathered_.data());
  for (int64_t i = 0; i < count; ++i) {
    float s = 0.0f;
    for (int t = 0; t < tp; ++t) s += parts[t * count + i];
    data[i] = s;
  }
  return absl::OkStatus();
}

absl::Status DistributedCollectives::RunMoe(int layer, const float* normed, int64_t tokens,
                                            int64_t hidden, const int32_t* topk_idx,
                                            const float* topk_w, int k, LocalExperts& local,
                                            float* y) {
  const int W = parallel_.world_size(), tp = parallel_.tp_size();
  const int tp_rank = parallel_.tp_rank_of(rank_);
  const size_t row_bytes = hidden * sizeof(float);
  const size_t entry_bytes = sizeof(int32_t) + row_bytes;  // expert id, then the row

  // 1. This rank dispatches the tokens t with t % tp == tp_rank (the TP group
  //    holds identical tokens; each is sent once). Entries are grouped by
  //    destination rank; `order[d]` remembers (token, k-slot) of each entry.
  std::vector<std::vector<std::pair<int64_t, int>>> order(W);
  for (int64_t t = tp_rank; t < tokens; t += tp) {
    for (int s = 0; s < k; ++s) {
      const int e = topk_idx[t * k + s];
      const auto& replicas = map_.replicas(layer, e);
      const int dest = replicas[(t + s) % replicas.size()].rank;
      order[dest].push_back({t, s});
    }
  }
  std::vector<size_t> send_counts(W), send_offsets(W);
  size_t total = 0;
  for (int d = 0; d < W; ++d) {
    send_offsets[d] = total;
    send_counts[d] = order[d].size() * entry_bytes;
    total += send_counts[d];
  }
  send_.resize(total);
  for (int d = 0; d < W; ++d) {
    char* p = send_.data() + send_offsets[d];
    for (auto [t, s] : order[d]) {
      const int32_t e = topk_idx[t * k + s];
      std::memcpy(p, &e, sizeof(e));
      std::memcpy(p + sizeof(e), normed + t * hidden, row_bytes);
      p += entry_bytes;
    }
  }
  std::vector<size_t> recv_counts(W), recv_offsets(W);
  FLOTILLA_RETURN_IF_ERROR(comm_->ExchangeCounts(send_counts, absl::MakeSpan(recv_counts)));
  size_t recv_total = 0;
  for (int p = 0; p < W; ++p) {
    if (recv_counts[p] % entry_bytes != 0) {
      return absl::InternalError(absl::StrCat("layer ", layer, ": rank ", p, " sent ",
                                              recv_counts[p], " bytes, not whole tokens"));
    }
    recv_offsets[p] = recv_total;
    recv_total += recv_counts[p];
  }
  recv_.resize(recv_total);
  FLOTILLA_RETURN_IF_ERROR(comm_->AllToAllV(send_.data(), send_counts, send_offsets, recv_.data(),
                                            recv_counts, recv_offsets));

  // 2. Run the received rows through the experts held here.
  const int64_t n = static_cast<int64_t>(recv_total / entry_bytes);
  rows_.resize(n * hidden);
  experts_.resize(n);
  for (int64_t i = 0; i < n; ++i) {
    const char* p = recv_.data() + i * entry_bytes;
    std::memcpy(&experts_[i], p, sizeof(int32_t));
    std::memcpy(&rows_[i * hidden], p + sizeof(int32_t), row_bytes);
  }
  out_.resize(n * hidden);
  if (n > 0) FLOTILLA_RETURN_IF_ERROR(local.Run(layer, rows_.data(), n, experts_.data(), out_.data()));

  // 3. Send each output back to the rank it came from (the reverse exchange:
  //    counts are known on both sides).
  std::vector<size_t> back_send_counts(W), back_send_offsets(W), back_recv_counts(W),
      back_recv_offsets(W);
  size_t back_total = 0;
  for (int p = 0; p < W; ++p) {
    back_send_counts[p] = recv_counts[p] / entry_bytes * row_bytes;
    back_send_offsets[p] = recv_offsets[p] / entry_bytes * row_bytes;
    back_recv_counts[p] = order[p].size() * row_bytes;
    back_recv_offsets[p] = back_total;
    back_total += back_recv_counts[p];
  }
  back_.resize(back_total);
  FLOTILLA_RETURN_IF_ERROR(comm_->AllToAllV(out_.data(), back_send_counts, back_send_offsets,
                                            back_.data(), back_recv_counts, back_recv_offsets));

  // 4. Combine: y[t] = sum over its experts in ascending expert order of w * out,
  //    the order the single-process engine uses.
  std::vector<const float*> result(tokens * k, nullptr);
  for (int d = 0; d < W; ++d) {
    const float* base = reinterpret_cast<const float*>(back_.data() + back_recv_offsets[d]);
    for (size_t i = 0; i < order[d].size(); ++i) {
      result[order[d][i].first * k + order[d][i].second] = base + i * hidden;
    }
  }
  std::vector<int> slots(k);
  for (int64_t t = tp_rank; t < tokens; t += tp) {
    for (int s = 0; s < k; ++s) slots[s] = s;
    std::sort(slots.begin(), slots.end(),
              [&](int a, int b) { return topk_idx[t * k + a] < topk_idx[t * k + b]; });
    float* yr = y + t * hidden;
    std::fill(yr, yr + hidden, 0.0f);
    for (int s : slots) {
      const float w = topk_w[t * k + s];
      const float* o = result[t * k + s];
      for (int64_t h = 0; h < hidden; ++h) yr[h] += o[h] * w;
    }
  }

  // 5. Share the combined rows inside the TP group so each rank has all of y.
  if (tp > 1) {
    std::vector<float> mine;
    for (int64_t t = tp_rank; t < tokens; t += tp) {
      mine.insert(mine.end(), y + t * hidden, y + (t + 1) * hidden);
    }
    std::vector<size_t> bytes_in(tp), offsets;
    for (int r = 0; r < tp; ++r) {
      const int64_t count = tokens > r ? (tokens - r + tp - 1) / tp : 0;
      bytes_in[r] = count * row_bytes;
    }
    FLOTILLA_RETURN_IF_ERROR(
        ExchangeInGroup(mine.data(), mine.size() * sizeof(float), bytes_in, &gathered_, &offsets));
    for (int r = 0; r < tp; ++r) {
      if (r == tp_rank) continue;
      const float* part = reinterpret_cast<const float*>(gathered_.data() + offsets[r]);
      int64_t i = 0;
      for (int64_t t = r; t < tokens; t += tp, ++i) {
        std::memcpy(y + t * hidden, part + i * hidden, row_bytes);
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace flotilla::worker
