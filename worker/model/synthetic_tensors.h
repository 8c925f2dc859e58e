// The synthetic checkpoint's tensors (what `flotilla make-checkpoint` writes),
// described tensor by tensor and generated over any element range on the host.
// The per-element rules live in common/synthetic_fill.h, shared with the CUDA
// generator; this file adds what needs the config and the tensor names.
#pragma once

#include <cstdint>

#include "absl/strings/string_view.h"
#include "common/model_config.h"
#include "common/model_spec.h"
#include "common/synthetic_fill.h"
#include "worker/model/safetensors.h"

namespace flotilla {

// How one tensor of the synthetic checkpoint is filled: its rule, the start of
// its stream and the dtype it is stored in.
struct SyntheticTensor {
  SyntheticFill fill;
  uint64_t state0 = 0;
  DType dtype = DType::kBF16;  // kNormal: BF16 or F32; kBytes and kScales: U8
};

// The stream of tensor `name` under `seed`: independent of the tensor's
// position in the checkpoint and of how the checkpoint is sharded.
uint64_t SyntheticTensorSeed(uint64_t seed, absl::string_view name);

// The fill rule of tensor `name` for `config`: values chosen so the model is
// numerically sane (activations of O(1) through the layers, router logits
// spread so tokens pick different experts, MXFP4 weights of about 1/sqrt(fan_in)).
// With weights.chain, the embedding and lm_head of the chain form.
SyntheticFill SyntheticFillFor(const ModelConfig& config, absl::string_view name,
                               const SyntheticWeights& weights = {});

SyntheticTensor SyntheticTensorFor(const ModelConfig& config, const SyntheticWeights& weights,
                                   absl::string_view name, DType dtype);

// The chain form's ordinary tokens: [0, SyntheticChainTokens(config)), the
// vocabulary below the first special or end-of-sequence token. Their lm_head
// rows are the embedding's rows permuted; the rest keep their own values.
int32_t SyntheticChainTokens(const ModelConfig& config);
// The token a chain-form model gives after `token` (the next greedy token
// when the residual is dominated by `token`'s embedding); -1 for a token
// outside the chain.
int32_t SyntheticChainNext(const ModelConfig& config, int32_t token);

// Writes elements [first, first + count) of `tensor` to `out` (count elements
// of DTypeSize(tensor.dtype) bytes). Large ranges are split over threads.
void FillSyntheticElements(const SyntheticTensor& tensor, int64_t first, int64_t count, void* out);

}  // namespace flotilla
