// --kv-cache-dtype: how the engines store the KV cache of full-attention
// layers. bf16 (the default; "auto" means it) or fp8: e4m3 codes with one
// bf16 scale per (position, kv head), the rule of kernels/cpu/kv_fp8.h.
// Sliding-window layers always stay bf16.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace flotilla {

enum class KvCacheDtype { kBf16, kFp8 };

inline const char* KvCacheDtypeName(KvCacheDtype d) {
  return d == KvCacheDtype::kFp8 ? "fp8" : "bf16";
}

// "auto" and "bf16" are bf16, "fp8" is fp8; anything else is INVALID_ARGUMENT
// naming the choices.
inline absl::StatusOr<KvCacheDtype> ParseKvCacheDtype(const std::string& name) {
  if (name == "auto" || name == "bf16") return KvCacheDtype::kBf16;
  if (name == "fp8") return KvCacheDtype::kFp8;
  return absl::InvalidArgumentError(
      absl::StrCat("kv cache dtype \"", name, "\" is not one of auto, bf16, fp8"));
}

}  // namespace flotilla
