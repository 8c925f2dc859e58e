#include "tests/comm/fake_communicator.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/bf16.h"
#include "common/status.h"

namespace flotilla::comm::testing {

FakeCommunicator::FakeCommunicator(int rank, int size) : rank_(rank), size_(size) {}

FakeCommunicator::FakeCommunicator(std::unique_ptr<Communicator> inner)
    : inner_(std::move(inner)), rank_(inner_->rank()), size_(inner_->size()) {}

void FakeCommunicator::FailNth(CommOp op, int nth, absl::Status status) {
  absl::MutexLock lock(&mu_);
  nth_failures_.push_back({op, nth, std::move(status)});
}

void FakeCommunicator::FailFrom(int index, absl::Status status) {
  absl::MutexLock lock(&mu_);
  fail_from_ = index;
  fail_from_status_ = std::move(status);
}

void FakeCommunicator::SetHook(std::function<absl::Status(const CommCall&)> hook) {
  absl::MutexLock lock(&mu_);
  hook_ = std::move(hook);
}

std::vector<CommCall> FakeCommunicator::calls() const {
  absl::MutexLock lock(&mu_);
  return calls_;
}

absl::Status FakeCommunicator::Script(CommOp op, size_t bytes, int root) {
  std::function<absl::Status(const CommCall&)> hook;
  CommCall call{op, 0, bytes, root};
  {
    absl::MutexLock lock(&mu_);
    call.index = static_cast<int>(calls_.size());
    calls_.push_back(call);
    const int nth = per_op_count_[static_cast<size_t>(op)]++;
    if (fail_from_ >= 0 && call.index >= fail_from_) return fail_from_status_;
    for (const NthFailure& f : nth_failures_) {
      if (f.op == op && f.nth == nth) return f.status;
    }
    hook = hook_;
  }
  if (hook) return hook(call);
  return absl::OkStatus();
}

absl::Status FakeCommunicator::AllReduce(void* buffer, size_t count, DataType type,
                                         void* stream) {
  FLOTILLA_RETURN_IF_ERROR(Script(CommOp::kAllReduce, count * DataTypeSize(type)));
  if (inner_) return inner_->AllReduce(buffer, count, type, stream);
  for (size_t i = 0; i < count; ++i) {
    if (type == DataType::kF32) {
      float* f = static_cast<float*>(buffer) + i;
      float sum = 0.f;
      for (int r = 0; r < size_; ++r) sum += *f;
      *f = sum;
    } else {
      uint16_t* b = static_cast<uint16_t*>(buffer) + i;
      float sum = 0.f;
      for (int r = 0; r < size_; ++r) sum += Bf16ToFloat(*b);
      *b = FloatToBf16(sum);
    }
  }
  return absl::OkStatus();
}

absl::Status FakeCommunicator::AllGather(const void* send, void* recv, size_t bytes_per_rank,
                                         void* stream) {
  FLOTILLA_RETURN_IF_ERROR(Script(CommOp::kAllGather, bytes_per_rank));
  if (inner_) return inner_->AllGather(send, recv, bytes_per_rank, stream);
  auto* out = static_cast<uint8_t*>(recv);
  const uint8_t* mine = out + static_cast<size_t>(rank_) * bytes_per_rank;
  if (bytes_per_rank > 0 && mine != send) std::memmove(out + static_cast<size_t>(rank_) * bytes_per_rank, send, bytes_per_rank);
  for (int r = 0; r < size_; ++r) {
    if (r != rank_ && bytes_per_rank > 0) {
      std::memcpy(out + static_cast<size_t>(r) * bytes_per_rank, mine, bytes_per_rank);
    }
  }
  return absl::OkStatus();
}

absl::Status FakeCommunicator::Broadcast(void* buffer, size_t bytes, int root, void* stream) {
  FLOTILLA_RETURN_IF_ERROR(Script(CommOp::kBroadcast, bytes, root));
  if (inner_) return inner_->Broadcast(buffer, bytes, root, stream);
  if (root < 0 || root >= size_) {
    return absl::InvalidArgumentError(
        absl::StrCat("Broadcast: root ", root, " is not a rank of a group of ", size_));
  }
  return absl::OkStatus();
}

absl::Status FakeCommunicator::AllToAllV(const void* send, absl::Span<const size_t> send_counts,
                                         absl::Span<const size_t> send_offsets, void* recv,
                                         absl::Span<const size_t> recv_counts,
                                         absl::Span<const size_t> recv_offsets, void* stream) {
  size_t total = 0;
  for (size_t c : send_counts) total += c;
  FLOTILLA_RETURN_IF_ERROR(Script(CommOp::kAllToAllV, total));
  if (inner_) {
    return inner_->AllToAllV(send, send_counts, send_offsets, recv, recv_counts, recv_offsets,
                             stream);
  }
  FLOTILLA_RETURN_IF_ERROR(
      ValidateAllToAllV(size_, send_counts, send_offsets, recv_counts, recv_offsets));
  for (size_t p = 0; p < send_counts.size(); ++p) {
    if (send_counts[p] != recv_counts[p]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "FakeCommunicator: echoing peer ", p, " returns ", send_counts[p],
          " bytes but this rank expects ", recv_counts[p]));
    }
    if (send_counts[p] > 0) {
      std::memcpy(static_cast<uint8_t*>(recv) + recv_offsets[p],
                  static_cast<const uint8_t*>(send) + send_offsets[p], send_counts[p]);
    }
  }
  return absl::OkStatus();
}

absl::Status FakeCommunicator::ExchangeCounts(absl::Span<const size_t> send_counts,
                                              absl::Span<size_t> recv_counts) {
  FLOTILLA_RETURN_IF_ERROR(Script(CommOp::kExchangeCounts, send_counts.size() * sizeof(size_t)));
  if (inner_) return inner_->ExchangeCounts(send_counts, recv_counts);
  if (send_counts.size() != static_cast<size_t>(size_) || recv_counts.size() != send_counts.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("ExchangeCounts: expected ", size_, " counts per side"));
  }
  std::copy(send_counts.begin(), send_counts.end(), recv_counts.begin());
  return absl::OkStatus();
}

absl::Status FakeCommunicator::Barrier(void* stream) {
  FLOTILLA_RETURN_IF_ERROR(Script(CommOp::kBarrier, 0));
  if (inner_) return inner_->Barrier(stream);
  return absl::OkStatus();
}

}  // namespace flotilla::comm::testing
