#include "worker/engine/cuda_kv_host_tier.h"

#include <algorithm>

#include "common/cuda_status.h"

namespace flotilla {

absl::StatusOr<std::unique_ptr<CudaKvHostTier>> CudaKvHostTier::Create(CudaDeviceState& d,
                                                                       int64_t bytes) {
  size_t slot = 0;
  for (size_t b : d.kv_pool_block_bytes) slot = std::max(slot, b);
  const int64_t slots = slot == 0 ? 0 : bytes / static_cast<int64_t>(slot);
  if (slots <= 0) return std::unique_ptr<CudaKvHostTier>();
  uint8_t* arena = nullptr;
  FLOTILLA_RETURN_IF_ERROR(d.AllocHost(&arena, static_cast<size_t>(slots) * slot));
  std::unique_ptr<CudaKvHostTier> t(new CudaKvHostTier(d));
  t->tier_ = std::make_unique<KvHostTier>(arena, slot, slots);
  return t;
}

absl::Status CudaKvHostTier::TakeError() {
  const cudaError_t e = error_;
  error_ = cudaSuccess;
  return CudaStatus(e, "kv host tier: cudaMemcpyAsync");
}

void CudaKvHostTier::Copy(int group, int32_t block, uint8_t* host, bool to_host) {
  size_t at = 0;
  for (const CudaDeviceState::Layer& L : d_.layers) {
    if (L.kv_group != group) continue;
    const size_t n = L.kv.fp8() ? static_cast<size_t>(L.kv.fp8_block_bytes)
                                : static_cast<size_t>(L.kv.kv_heads) * L.kv.block_size *
                                      L.kv.head_dim * sizeof(uint16_t);
    void* arrays[2] = {L.kv.fp8() ? static_cast<void*>(L.kv.k8) : L.kv.k,
                       L.kv.fp8() ? static_cast<void*>(L.kv.v8) : L.kv.v};
    for (void* array : arrays) {
      char* device = static_cast<char*>(array) + static_cast<size_t>(block) * n;
      const cudaError_t e =
          to_host ? cudaMemcpyAsync(host + at, device, n, cudaMemcpyDeviceToHost, d_.stream)
                  : cudaMemcpyAsync(device, host + at, n, cudaMemcpyHostToDevice, d_.stream);
      if (e != cudaSuccess && error_ == cudaSuccess) error_ = e;
      at += n;
    }
  }
}

void CudaKvHostTier::ToHost(int group, int32_t block, uint8_t* host) {
  Copy(group, block, host, true);
}

void CudaKvHostTier::ToDevice(int group, int32_t block, const uint8_t* host) {
  Copy(group, block, const_cast<uint8_t*>(host), false);
}

}  // namespace flotilla
