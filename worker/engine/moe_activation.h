// --moe-activation: the precision of the experts' inputs (the gate_up
// projection's x and the down projection's SwiGLU output). "auto" and
// "bf16" keep the engine's own (f32 on the CPU engine); "fp8" rounds both
// through MXFP8 blocks (kernels/cpu/mxfp8.h) before the MXFP4 products, the
// numerics of an FP8-activation (W4A8) MoE kernel, whose accuracy
// tests/engine/moe_fp8_activation_test.cc measures.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace flotilla {

enum class MoeActivation { kDefault, kFp8 };

inline const char* MoeActivationName(MoeActivation a) {
  return a == MoeActivation::kFp8 ? "fp8" : "bf16";
}

// "auto" and "bf16" are kDefault, "fp8" is kFp8; anything else is
// INVALID_ARGUMENT naming the choices.
inline absl::StatusOr<MoeActivation> ParseMoeActivation(const std::string& name) {
  if (name == "auto" || name == "bf16") return MoeActivation::kDefault;
  if (name == "fp8") return MoeActivation::kFp8;
  return absl::InvalidArgumentError(
      absl::StrCat("moe activation \"", name, "\" is not one of auto, bf16, fp8"));
}

}  // namespace flotilla
