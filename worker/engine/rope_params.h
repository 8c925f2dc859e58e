// YaRN RoPE parameters of a model's config, from which both engines compute
// the inverse frequencies and the attention scaling.
#pragma once

#include "common/model_config.h"
#include "kernels/cpu/ops.h"

namespace flotilla {

inline kernels::cpu::YarnParams YarnParamsOf(const ModelConfig& c) {
  kernels::cpu::YarnParams p;
  p.theta = c.rope_theta;
  p.head_dim = c.head_dim;
  p.factor = c.rope_scaling.factor;
  p.original_max_position_embeddings =
      static_cast<double>(c.rope_scaling.original_max_position_embeddings);
  p.beta_fast = c.rope_scaling.beta_fast;
  p.beta_slow = c.rope_scaling.beta_slow;
  p.truncate = c.rope_scaling.truncate;
  return p;
}

}  // namespace flotilla
