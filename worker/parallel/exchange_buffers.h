// The device memory behind one rank's device context: the receive buffers
// its peers write into (one allocation, so one CUDA IPC handle exports it)
// and its private working state (kernels/cuda/ep_exchange.h has the layouts).
// Everything is sized once, for the largest step, so that no step allocates
// and captured graphs keep their pointers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "kernels/cuda/ep_exchange.h"

namespace flotilla::parallel {

struct ExchangeSizes {
  int world = 1;
  int tp = 1;
  int hidden = 0;
  int top_k = 0;
  int64_t max_tokens = 0;  // per rank and step
  bool ipc = true;         // flags and all-reduce staging are needed only by cuda-ipc
  bool flagged_lines = true;  // cuda-ipc: the small combines' lines

  // Rows one source may send one destination in a step of `tokens` tokens
  // per rank: all of its share's pairs, the worst case.
  int64_t CapFor(int64_t tokens) const { return (tokens + tp - 1) / tp * top_k; }
  int64_t cap_max() const { return CapFor(max_tokens); }
  int64_t rows_max() const { return world * cap_max(); }
};

// Byte offsets of the receive buffers inside their allocation; the same on
// every rank of a context, so a peer's mapping is decoded with this rank's.
struct RecvLayout {
  size_t x = 0, meta = 0, combined = 0, gathered = 0, reduce = 0, flags = 0, ll = 0,
         combined_ll = 0, gathered_ll = 0, bytes = 0;
  int64_t ll_count = 0;        // f32 elements of one flagged-line all-reduce
  int ll_cap = 0;              // rows per segment the small combines' lines hold
  int gathered_ll_tokens = 0;  // tokens the small combines' gather lines hold
  static RecvLayout For(const ExchangeSizes& sizes);
  kernels::cuda::EpRecvBuffers At(void* base) const;
};

class ExchangeBuffers {
 public:
  // Allocates and zeroes everything (flags and sequence numbers start at 0);
  // returns once the zeroing finished, so the receive buffers may be
  // exported at once.
  static absl::StatusOr<std::unique_ptr<ExchangeBuffers>> Create(const ExchangeSizes& sizes);
  ~ExchangeBuffers();
  ExchangeBuffers(const ExchangeBuffers&) = delete;
  ExchangeBuffers& operator=(const ExchangeBuffers&) = delete;

  const ExchangeSizes& sizes() const { return sizes_; }
  const RecvLayout& layout() const { return layout_; }
  // The receive allocation (what a CUDA IPC handle exports).
  void* recv_base() const { return recv_; }
  kernels::cuda::EpRecvBuffers recv() const { return layout_.At(recv_); }
  const kernels::cuda::EpState& state() const { return state_; }

 private:
  explicit ExchangeBuffers(const ExchangeSizes& sizes)
      : sizes_(sizes), layout_(RecvLayout::For(sizes)) {}
  absl::Status Allocate();

  ExchangeSizes sizes_;
  RecvLayout layout_;
  void* recv_ = nullptr;
  void* local_ = nullptr;  // one allocation for EpState's arrays
  kernels::cuda::EpState state_;
};

}  // namespace flotilla::parallel
