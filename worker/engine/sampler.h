// Token sampling for one request: penalties, temperature, top-k, top-p,
// min-p, a per-request seeded RNG and logprobs.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace flotilla {

struct SamplingParams {
  float temperature = 1.0f;  // 0 = greedy (argmax)
  float top_p = 1.0f;        // (0, 1]; keep the smallest set with this much mass
  int top_k = 0;             // 0 = off
  float min_p = 0.0f;        // [0, 1]; drop tokens below min_p * p(most likely)
  std::optional<uint64_t> seed;  // same seed, same tokens; unset = random
  // OpenAI semantics over the tokens generated so far (not the prompt):
  // logit[t] -= count[t] * frequency_penalty + (count[t] > 0) * presence_penalty.
  float frequency_penalty = 0.0f;  // [-2, 2]
  float presence_penalty = 0.0f;   // [-2, 2]
  bool logprobs = false;           // report the chosen token's logprob
  int top_logprobs = 0;            // [0, 20] alternatives per position (needs logprobs)
  std::optional<std::vector<int>> stop_token_ids;  // unset = the config's eos ids
  int64_t max_tokens = 16;                         // >= 1

  // INVALID_ARGUMENT naming the first bad field.
  absl::Status Validate(int vocab_size) const;
};

struct TokenLogprob {
  int32_t token = -1;
  float logprob = 0;                               // log-softmax of the model's logits
  std::vector<std::pair<int32_t, float>> top;      // most likely first
};

class Sampler {
 public:
  static absl::StatusOr<std::unique_ptr<Sampler>> Create(const SamplingParams& params,
                                                         int vocab_size);

  // Picks the next token from `logits` [vocab_size] and records it for the
  // penalties. Fills `logprob` (when not null) from the unmodified logits.
  int32_t Sample(const float* logits, TokenLogprob* logprob);

  // The distribution Sample draws from (after penalties, temperature and the
  // top-k / top-p / min-p filters), as (token, probability) pairs. For tests.
  std::vector<std::pair<int32_t, float>> Distribution(const float* logits);

  const SamplingParams& params() const { return params_; }

 private:
  Sampler(const SamplingParams& params, int vocab_size, uint64_t seed);
  // Penalised logits.
  void Penalise(const float* logits, std::vector<float>* out) const;
  double NextUniform();

  SamplingParams params_;
  int vocab_size_;
  std::mt19937_64 rng_;
  std::unordered_map<int32_t, int64_t> counts_;
  std::vector<float> work_;
  std::vector<int32_t> order_;
};

// log-softmax of logits [n] into out [n].
void LogSoftmax(const float* logits, int64_t n, float* out);
// Index of the largest value, the lowest such index on ties.
int32_t Argmax(const float* values, int64_t n);

}  // namespace flotilla
