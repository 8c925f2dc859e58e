// Token sampling for one request: penalties, logit bias, temperature, top-k,
// top-p, min-p, a per-request seeded random stream (indexed by the draw
// count) and logprobs. A Sampler is also the request's sampling state when
// another device samples (CudaEngine): it hands out the seed, the draw count
// and the sparse logit adjustments, and records the tokens drawn elsewhere.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
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
  // Hugging Face / vLLM semantics over the prompt and the tokens generated so
  // far: a positive logit is divided by it, a negative one multiplied. 1 = off.
  float repetition_penalty = 1.0f;  // (0, 2]
  // (token id, bias in [-100, 100]) added to the logit before sampling.
  std::vector<std::pair<int32_t, float>> logit_bias;
  bool logprobs = false;           // report the chosen token's logprob
  int top_logprobs = 0;            // [0, 20] alternatives per position (needs logprobs)
  std::optional<std::vector<int>> stop_token_ids;  // unset = the config's eos ids
  int64_t max_tokens = 16;                         // >= 1
  // The stop tokens are suppressed (kSuppressedLogitAdd) until this many
  // tokens were drawn; 0 = off.
  int64_t min_tokens = 0;

  // INVALID_ARGUMENT naming the first bad field.
  absl::Status Validate(int vocab_size) const;
};

struct TokenLogprob {
  int32_t token = -1;
  float logprob = 0;                               // log-softmax of the model's logits
  std::vector<std::pair<int32_t, float>> top;      // most likely first
};

// What min_tokens adds to a stop token's logit: finite, so that a token
// filter allowing only stop tokens still leaves them drawable (the constraint
// wins), and large enough that exp() of the difference is 0 otherwise.
inline constexpr float kSuppressedLogitAdd = -1e9f;

// One token's change before sampling: logit' = Adjust(logit) (see AdjustLogit).
struct LogitAdjustment {
  int32_t token = 0;
  float repetition = 1.0f;  // 1: none
  float add = 0.0f;         // logit bias minus the frequency / presence penalties
};

// The order of operations every sampler applies (the GPU kernel repeats it).
inline float AdjustLogit(float logit, float repetition, float add) {
  if (repetition != 1.0f) logit = logit > 0.0f ? logit / repetition : logit * repetition;
  return logit + add;
}

// Which tokens may be drawn next (structured outputs): a bitset over the
// vocabulary (bit t of word t / 32), told of every token drawn.
class TokenFilter {
 public:
  virtual ~TokenFilter() = default;
  // MaskWords(vocab) words; null when every token is allowed.
  virtual const uint32_t* Allowed() = 0;
  virtual void Accept(int32_t token) = 0;
};

class Sampler {
 public:
  // `prompt`: the request's prompt tokens (they count for repetition_penalty).
  static absl::StatusOr<std::unique_ptr<Sampler>> Create(const SamplingParams& params,
                                                         int vocab_size,
                                                         const std::vector<int32_t>& prompt = {});

  // Picks the next token from `logits` [vocab_size] and records it for the
  // penalties. Fills `logprob` (when not null) from the unmodified logits.
  int32_t Sample(const float* logits, TokenLogprob* logprob);

  // The distribution Sample draws from (after penalties, temperature and the
  // top-k / top-p / min-p filters), as (token, probability) pairs. For tests.
  std::vector<std::pair<int32_t, float>> Distribution(const float* logits);

  const SamplingParams& params() const { return params_; }

  // Draws only tokens `filter` allows from now on (the sampler owns it).
  void SetFilter(std::unique_ptr<TokenFilter> filter) { filter_ = std::move(filter); }
  // The next draw's allowed tokens (null: any). For a sampler on another device.
  const uint32_t* Allowed() { return filter_ ? filter_->Allowed() : nullptr; }
  bool has_filter() const { return filter_ != nullptr; }

  // For a sampler on another device: the seed in force (drawn at creation
  // when the request set none), how many tokens were drawn so far, the
  // adjustments the next draw applies (sorted by token; empty when no
  // penalty or bias is in force), and the token drawn there.
  uint64_t seed() const { return seed_; }
  uint64_t draws() const { return draws_; }
  const std::vector<LogitAdjustment>& Adjustments();
  // Counts `token` as drawn: the penalties' counts, min_tokens, the filter's
  // state and the draw count all advance, and the next draw uses the random
  // value of the next position of the seed's stream. Recording a request's
  // earlier output one token at a time (request migration) leaves the
  // sampler where the sampler that drew it was.
  void Record(int32_t token);

 private:
  Sampler(const SamplingParams& params, int vocab_size, uint64_t seed,
          const std::vector<int32_t>& prompt);
  // Adjusted logits.
  void Penalise(const float* logits, std::vector<float>* out);
  double NextUniform();

  SamplingParams params_;
  int vocab_size_;
  uint64_t seed_;
  uint64_t draws_ = 0;
  std::unordered_map<int32_t, int64_t> counts_;
  std::vector<int32_t> prompt_tokens_;  // distinct, when repetition_penalty is on
  std::vector<LogitAdjustment> adjustments_;
  std::unique_ptr<TokenFilter> filter_;
  bool adjustments_stale_ = true;
  std::vector<float> work_;
  std::vector<int32_t> order_;
};

// Sets the logits of tokens not in `allowed` (a bitset over n tokens) to
// -infinity; leaves them all when none is allowed.
void MaskLogits(const uint32_t* allowed, int64_t n, float* logits);
// log-softmax of logits [n] into out [n].
void LogSoftmax(const float* logits, int64_t n, float* out);
// Index of the largest value, the lowest such index on ties.
int32_t Argmax(const float* values, int64_t n);

}  // namespace flotilla
