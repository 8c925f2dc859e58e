// The CUDA engine's side of the host-memory KV tier (kv_host_tier.h): a
// pinned host arena and the copies of one group's block (every layer's K
// and V, bf16 or FP8 codes and scales) between the device arena and it,
// cudaMemcpyAsync on the engine's stream so they stay ordered with the
// steps (an evicted block is copied out before a later step writes it).
// Internal to the CUDA engine.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "worker/engine/cuda_engine_state.h"
#include "worker/engine/kv_block_allocator.h"
#include "worker/engine/kv_host_tier.h"

namespace flotilla {

class CudaKvHostTier final : public KvBlockMover {
 public:
  // `bytes` of pinned host memory from the engine's arena (slots of the
  // largest group's block); nullptr when `bytes` holds no block.
  static absl::StatusOr<std::unique_ptr<CudaKvHostTier>> Create(CudaDeviceState& d, int64_t bytes);

  KvHostTier& tier() { return *tier_; }
  // The first copy that failed since the last call (then cleared).
  absl::Status TakeError();

  size_t BlockBytes(int group) const override { return d_.kv_pool_block_bytes[group]; }
  void ToHost(int group, int32_t block, uint8_t* host) override;
  void ToDevice(int group, int32_t block, const uint8_t* host) override;

 private:
  explicit CudaKvHostTier(CudaDeviceState& d) : d_(d) {}
  // Copies K then V of each of the group's layers (in layer order) between
  // `block` of the arena and `host`.
  void Copy(int group, int32_t block, uint8_t* host, bool to_host);

  CudaDeviceState& d_;
  std::unique_ptr<KvHostTier> tier_;
  cudaError_t error_ = cudaSuccess;
};

}  // namespace flotilla
