#include "common/sampling_check.h"

#include <cmath>
#include <string>
#include <tuple>

#include "absl/strings/str_cat.h"

namespace flotilla {
namespace {

absl::Status Invalid(const std::string& field, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat("sampling.", field, ": ", why));
}

// `v` within [lo, hi], or (lo, hi] when `lo_open`; NaN and infinities never are.
absl::Status InRange(const std::string& field, double v, double lo, double hi,
                     bool lo_open = false) {
  if (std::isfinite(v) && v <= hi && (lo_open ? v > lo : v >= lo)) return absl::OkStatus();
  return Invalid(field, absl::StrCat("must be in ", lo_open ? "(" : "[", lo, ", ", hi, "], not ", v));
}

absl::Status CheckTokenId(const std::string& field, int32_t token, int vocab_size) {
  if (token >= 0 && token < vocab_size) return absl::OkStatus();
  return Invalid(field, absl::StrCat("token id ", token, " is outside the vocabulary [0, ",
                                     vocab_size, ")"));
}

}  // namespace

absl::Status CheckSamplingParams(const common::SamplingParams& s, int vocab_size) {
  if (s.has_temperature()) {
    if (absl::Status st = InRange("temperature", s.temperature(), 0, 2); !st.ok()) return st;
  }
  if (s.has_top_p()) {
    if (absl::Status st = InRange("top_p", s.top_p(), 0, 1, /*lo_open=*/true); !st.ok()) return st;
  }
  if (s.top_k() < 0) return Invalid("top_k", absl::StrCat("must be >= 0 (0 = off), not ", s.top_k()));
  for (const auto& [field, value, lo, hi] :
       {std::tuple<const char*, double, double, double>{"min_p", s.min_p(), 0, 1},
        {"frequency_penalty", s.frequency_penalty(), -2, 2},
        {"presence_penalty", s.presence_penalty(), -2, 2}}) {
    if (absl::Status st = InRange(field, value, lo, hi); !st.ok()) return st;
  }
  if (s.has_repetition_penalty()) {
    absl::Status st = InRange("repetition_penalty", s.repetition_penalty(), 0, 2, /*lo_open=*/true);
    if (!st.ok()) return st;
  }
  if (s.logprobs() > 20) return Invalid("logprobs", absl::StrCat("must be in [0, 20], not ", s.logprobs()));
  for (const auto& [token, bias] : s.logit_bias()) {
    const std::string field = absl::StrCat("logit_bias[", token, "]");
    if (absl::Status st = CheckTokenId(field, token, vocab_size); !st.ok()) return st;
    if (absl::Status st = InRange(field, bias, -100, 100); !st.ok()) return st;
  }
  for (int i = 0; i < s.stop_token_ids_size(); ++i) {
    absl::Status st =
        CheckTokenId(absl::StrCat("stop_token_ids[", i, "]"), s.stop_token_ids(i), vocab_size);
    if (!st.ok()) return st;
  }
  if (s.max_tokens() != 0 && s.min_tokens() > s.max_tokens()) {
    return Invalid("min_tokens", absl::StrCat("must be at most max_tokens (", s.max_tokens(),
                                              "), not ", s.min_tokens()));
  }
  return absl::OkStatus();
}

}  // namespace flotilla
