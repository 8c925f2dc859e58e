#include "worker/parallel/exchange_buffers.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <functional>
#include <vector>

#include "common/cuda_status.h"
#include "common/status.h"

namespace flotilla::parallel {
namespace {

namespace kc = kernels::cuda;

// Places regions of `bytes` one after the other, each 256-byte aligned (the
// kernels move 16-byte vectors; 256 keeps rows of peers' mappings aligned
// the same way as this rank's).
class Packer {
 public:
  size_t Take(size_t bytes) {
    const size_t at = end_;
    end_ = (end_ + bytes + 255) / 256 * 256;
    return at;
  }
  // Takes a region of `count` elements for `field`, which PointInto aims at
  // it once the allocation exists: each field is named once, with its type.
  template <typename T>
  void Place(T*& field, size_t count) {
    const size_t at = Take(count * sizeof(T));
    fields_.push_back([&field, at](char* base) { field = reinterpret_cast<T*>(base + at); });
  }
  void PointInto(void* base) const {
    for (const auto& point : fields_) point(static_cast<char*>(base));
  }
  size_t end() const { return end_; }

 private:
  size_t end_ = 0;
  std::vector<std::function<void(char*)>> fields_;
};

}  // namespace

RecvLayout RecvLayout::For(const ExchangeSizes& s) {
  const size_t rows = static_cast<size_t>(s.rows_max());
  const size_t hidden = static_cast<size_t>(s.hidden);
  Packer p;
  RecvLayout l;
  l.x = p.Take(rows * hidden * sizeof(uint16_t));
  l.meta = p.Take(static_cast<size_t>(s.world) * (s.cap_max() + 1) * sizeof(int32_t));
  l.combined = p.Take(rows * hidden * sizeof(float));
  const bool join_tp = s.ipc && s.tp > 1;
  l.gathered = p.Take(join_tp ? static_cast<size_t>(s.max_tokens) * hidden * sizeof(float) : 0);
  l.reduce = p.Take(join_tp ? static_cast<size_t>(2 * s.tp) * kc::kEpMaxBlocks *
                                  kc::kEpReduceChunk * sizeof(float)
                            : 0);
  l.flags = p.Take(s.ipc ? kc::EpFlagLayout{s.world, s.tp}.words() * sizeof(uint64_t) : 0);
  // The flagged lines: two values per 16-byte line, for the step's largest
  // all-reduce up to kEpLlMaxCount (hidden is a multiple of 8, so even).
  l.ll_count = join_tp ? std::min<int64_t>(s.max_tokens * s.hidden, kc::kEpLlMaxCount) : 0;
  l.ll = p.Take(static_cast<size_t>(2 * s.tp) * static_cast<size_t>(l.ll_count / 2) * 16);
  // The small combines as 16-byte flagged lines of two f32 values: their
  // outputs and, with TP > 1, their gathered tokens.
  l.ll_cap = s.ipc && s.flagged_lines
                 ? static_cast<int>(std::min<int64_t>(s.cap_max(), kc::kEpLlMaxCap))
                 : 0;
  l.combined_ll = p.Take(static_cast<size_t>(s.world) * l.ll_cap * (hidden / 2) * 16);
  // A combine goes as lines when ceil(tokens / tp) * top_k <= ll_cap.
  l.gathered_ll_tokens =
      join_tp && l.ll_cap > 0
          ? static_cast<int>(std::min<int64_t>(s.max_tokens, s.tp * (l.ll_cap / s.top_k)))
          : 0;
  l.gathered_ll = p.Take(static_cast<size_t>(l.gathered_ll_tokens) * (hidden / 2) * 16);
  l.bytes = p.end();
  return l;
}

kc::EpRecvBuffers RecvLayout::At(void* base) const {
  char* b = static_cast<char*>(base);
  kc::EpRecvBuffers r;
  r.x = reinterpret_cast<uint16_t*>(b + x);
  r.meta = reinterpret_cast<int32_t*>(b + meta);
  r.combined = reinterpret_cast<float*>(b + combined);
  r.gathered = reinterpret_cast<float*>(b + gathered);
  r.reduce = reinterpret_cast<float*>(b + reduce);
  r.flags = reinterpret_cast<uint64_t*>(b + flags);
  r.ll = reinterpret_cast<uint32_t*>(b + ll);
  r.ll_count = ll_count;
  r.combined_ll = ll_cap > 0 ? reinterpret_cast<uint32_t*>(b + combined_ll) : nullptr;
  r.ll_cap = ll_cap;
  r.gathered_ll = gathered_ll_tokens > 0 ? reinterpret_cast<uint32_t*>(b + gathered_ll) : nullptr;
  r.gathered_ll_tokens = gathered_ll_tokens;
  return r;
}

absl::StatusOr<std::unique_ptr<ExchangeBuffers>> ExchangeBuffers::Create(
    const ExchangeSizes& sizes) {
  if (sizes.world < 1 || sizes.world > kc::kEpMaxRanks || sizes.tp < 1 ||
      sizes.world % sizes.tp != 0 || sizes.hidden <= 0 || sizes.hidden % 8 != 0 ||
      sizes.top_k < 1 || sizes.max_tokens < 0) {
    return absl::InvalidArgumentError(
        "device exchange: world in [1, 256] divisible by tp, hidden a positive multiple of 8, "
        "top_k >= 1 and max_tokens >= 0 are required");
  }
  std::unique_ptr<ExchangeBuffers> b(new ExchangeBuffers(sizes));
  FLOTILLA_RETURN_IF_ERROR(b->Allocate());
  return b;
}

absl::Status ExchangeBuffers::Allocate() {
  FLOTILLA_CUDA_RETURN_IF_ERROR(cudaMalloc(&recv_, layout_.bytes));
  FLOTILLA_CUDA_RETURN_IF_ERROR(cudaMemset(recv_, 0, layout_.bytes));
  const size_t rows = static_cast<size_t>(sizes_.rows_max());
  const size_t pairs = static_cast<size_t>(sizes_.cap_max());
  Packer p;
  p.Place(state_.slot, rows);
  p.Place(state_.ones, rows);
  p.Place(state_.out, rows * sizes_.hidden);
  p.Place(state_.recv_count, sizes_.world);
  p.Place(state_.route, pairs);
  p.Place(state_.order, pairs);
  p.Place(state_.order_w, pairs);
  p.Place(state_.epochs, kc::kEpEpochWords);
  p.Place(state_.error, 1);
  FLOTILLA_CUDA_RETURN_IF_ERROR(cudaMalloc(&local_, p.end()));
  FLOTILLA_CUDA_RETURN_IF_ERROR(cudaMemset(local_, 0, p.end()));
  p.PointInto(local_);
  // cudaMemset may run asynchronously to the host: peers must not see the
  // buffers before they are zero.
  return CudaStatus(cudaDeviceSynchronize(), "zeroing the exchange buffers");
}

ExchangeBuffers::~ExchangeBuffers() {
  if (recv_ != nullptr) cudaFree(recv_);
  if (local_ != nullptr) cudaFree(local_);
}

}  // namespace flotilla::parallel
