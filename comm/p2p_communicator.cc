#include "comm/p2p_communicator.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/bf16.h"
#include "common/status.h"

namespace flotilla::comm {
namespace {

// Tags carry the collective's sequence number above a few phase bits.
constexpr int kPhaseBits = 2;

// Chunk [begin, end) of `count` elements owned by `rank` in AllReduce.
void ChunkOf(size_t count, int size, int rank, size_t* begin, size_t* end) {
  const size_t base = count / static_cast<size_t>(size);
  const size_t extra = count % static_cast<size_t>(size);
  const size_t r = static_cast<size_t>(rank);
  *begin = r * base + std::min(r, extra);
  *end = *begin + base + (r < extra ? 1 : 0);
}

}  // namespace

absl::Status P2pCommunicator::Begin(uint64_t* tag) {
  if (!broken_.ok()) {
    return absl::UnavailableError(
        absl::StrCat("communicator is broken after an earlier failure: ", broken_.message()));
  }
  *tag = sequence_++ << kPhaseBits;
  return absl::OkStatus();
}

absl::Status P2pCommunicator::Step(uint64_t tag, absl::Span<const SendOp> sends,
                                   absl::Span<const RecvOp> recvs) {
  absl::Status st = Exchange(tag, sends, recvs);
  if (!st.ok()) broken_ = st;  // peers are now out of step with this rank
  return st;
}

absl::Status P2pCommunicator::Barrier(void* /*stream*/) {
  uint64_t tag;
  FLOTILLA_RETURN_IF_ERROR(Begin(&tag));
  sends_.clear();
  recvs_.clear();
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    sends_.push_back({p, nullptr, 0});
    recvs_.push_back({p, nullptr, 0});
  }
  return Step(tag, sends_, recvs_);
}

absl::Status P2pCommunicator::Broadcast(void* buffer, size_t bytes, int root, void* /*stream*/) {
  if (root < 0 || root >= size_) {
    return absl::InvalidArgumentError(
        absl::StrCat("Broadcast: root ", root, " is not a rank of a group of ", size_));
  }
  if (buffer == nullptr && bytes > 0) {
    return absl::InvalidArgumentError("Broadcast: null buffer");
  }
  uint64_t tag;
  FLOTILLA_RETURN_IF_ERROR(Begin(&tag));
  sends_.clear();
  recvs_.clear();
  if (rank_ == root) {
    for (int p = 0; p < size_; ++p) {
      if (p != root) sends_.push_back({p, buffer, bytes});
    }
  } else {
    recvs_.push_back({root, buffer, bytes});
  }
  return Step(tag, sends_, recvs_);
}

absl::Status P2pCommunicator::AllGather(const void* send, void* recv, size_t bytes_per_rank,
                                        void* /*stream*/) {
  if ((send == nullptr || recv == nullptr) && bytes_per_rank > 0) {
    return absl::InvalidArgumentError("AllGather: null buffer");
  }
  uint64_t tag;
  FLOTILLA_RETURN_IF_ERROR(Begin(&tag));
  auto* out = static_cast<uint8_t*>(recv);
  uint8_t* mine = out + static_cast<size_t>(rank_) * bytes_per_rank;
  if (bytes_per_rank > 0 && mine != send) std::memmove(mine, send, bytes_per_rank);
  sends_.clear();
  recvs_.clear();
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    sends_.push_back({p, mine, bytes_per_rank});
    recvs_.push_back({p, out + static_cast<size_t>(p) * bytes_per_rank, bytes_per_rank});
  }
  return Step(tag, sends_, recvs_);
}

absl::Status P2pCommunicator::AllToAllV(const void* send, absl::Span<const size_t> send_counts,
                                        absl::Span<const size_t> send_offsets, void* recv,
                                        absl::Span<const size_t> recv_counts,
                                        absl::Span<const size_t> recv_offsets, void* /*stream*/) {
  FLOTILLA_RETURN_IF_ERROR(
      ValidateAllToAllV(size_, send_counts, send_offsets, recv_counts, recv_offsets));
  size_t send_total = 0, recv_total = 0;
  for (size_t p = 0; p < send_counts.size(); ++p) {
    send_total += send_counts[p];
    recv_total += recv_counts[p];
  }
  if ((send == nullptr && send_total > 0) || (recv == nullptr && recv_total > 0)) {
    return absl::InvalidArgumentError("AllToAllV: null buffer with non-zero counts");
  }
  const size_t me = static_cast<size_t>(rank_);
  if (send_counts[me] != recv_counts[me]) {
    return absl::InvalidArgumentError(
        absl::StrCat("AllToAllV: rank ", rank_, " sends itself ", send_counts[me],
                     " bytes but expects to receive ", recv_counts[me]));
  }
  uint64_t tag;
  FLOTILLA_RETURN_IF_ERROR(Begin(&tag));
  const auto* in = static_cast<const uint8_t*>(send);
  auto* out = static_cast<uint8_t*>(recv);
  if (send_counts[me] > 0) {
    std::memcpy(out + recv_offsets[me], in + send_offsets[me], send_counts[me]);
  }
  sends_.clear();
  recvs_.clear();
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    const size_t q = static_cast<size_t>(p);
    sends_.push_back({p, in + send_offsets[q], send_counts[q]});
    recvs_.push_back({p, out + recv_offsets[q], recv_counts[q]});
  }
  return Step(tag, sends_, recvs_);
}

absl::Status P2pCommunicator::AllReduce(void* buffer, size_t count, DataType type,
                                        void* /*stream*/) {
  const size_t elem = DataTypeSize(type);
  if (elem == 0) return absl::InvalidArgumentError("AllReduce: unknown data type");
  if (buffer == nullptr && count > 0) return absl::InvalidArgumentError("AllReduce: null buffer");
  uint64_t tag;
  FLOTILLA_RETURN_IF_ERROR(Begin(&tag));
  if (size_ == 1) return absl::OkStatus();
  auto* data = static_cast<uint8_t*>(buffer);

  // Phase 1 (reduce-scatter): every rank sends chunk p to its owner p; the owner
  // sums all copies in rank order, so the result is the same on every rank.
  size_t my_begin, my_end;
  ChunkOf(count, size_, rank_, &my_begin, &my_end);
  const size_t my_bytes = (my_end - my_begin) * elem;
  scratch_.resize(my_bytes * static_cast<size_t>(size_));
  // Between this rank and each peer p: p's chunk of the buffer one way, a
  // region of this rank's chunk size (`own(p)`) the other.
  auto pair_chunks = [&](bool chunks_out, auto own) {
    sends_.clear();
    recvs_.clear();
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      size_t b, e;
      ChunkOf(count, size_, p, &b, &e);
      uint8_t* chunk = data + b * elem;
      if (chunks_out) {
        sends_.push_back({p, chunk, (e - b) * elem});
        recvs_.push_back({p, own(p), my_bytes});
      } else {
        sends_.push_back({p, own(p), my_bytes});
        recvs_.push_back({p, chunk, (e - b) * elem});
      }
    }
  };
  pair_chunks(true, [&](int p) { return scratch_.data() + static_cast<size_t>(p) * my_bytes; });
  FLOTILLA_RETURN_IF_ERROR(Step(tag, sends_, recvs_));

  uint8_t* mine = data + my_begin * elem;
  if (my_bytes > 0)
    std::memcpy(scratch_.data() + static_cast<size_t>(rank_) * my_bytes, mine, my_bytes);
  const size_t n = my_end - my_begin;
  for (size_t i = 0; i < n; ++i) {
    float sum = 0.f;
    for (int p = 0; p < size_; ++p) {
      const uint8_t* src = scratch_.data() + static_cast<size_t>(p) * my_bytes + i * elem;
      if (type == DataType::kF32) {
        float v;
        std::memcpy(&v, src, sizeof(v));
        sum += v;
      } else {
        uint16_t v;
        std::memcpy(&v, src, sizeof(v));
        sum += Bf16ToFloat(v);
      }
    }
    if (type == DataType::kF32) {
      std::memcpy(mine + i * elem, &sum, sizeof(sum));
    } else {
      const uint16_t v = FloatToBf16(sum);
      std::memcpy(mine + i * elem, &v, sizeof(v));
    }
  }

  // Phase 2 (all-gather of the reduced chunks).
  pair_chunks(false, [&](int) { return mine; });
  return Step(tag | 1, sends_, recvs_);
}

}  // namespace flotilla::comm
