// One request end to end on a CpuEngine: prefill the prompt (in chunks), then
// sample token by token until a stop token, max_tokens or the context limit.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/engine/engine.h"
#include "worker/engine/sampler.h"

namespace flotilla {

struct GenerateOptions {
  SamplingParams sampling;
  int64_t prefill_chunk = 0;         // prompt tokens per step; 0 = the whole prompt at once
  bool return_prompt_logits = false;  // logits at every prompt position
};

struct GenerationResult {
  std::vector<int32_t> tokens;        // generated ids, without the stop token
  std::string finish_reason;          // "stop" or "length"
  int32_t stop_token = -1;            // the stop token that ended generation, if any
  std::vector<TokenLogprob> logprobs;  // one per generated token (and the stop token) when asked
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;       // generated tokens including the stop token
  std::vector<float> prompt_logits;   // [prompt_tokens, vocab_size] when asked
};

// The sequence is created and freed inside. Errors: bad sampling parameters,
// empty prompt, token ids out of range, a prompt longer than the context.
absl::StatusOr<GenerationResult> Generate(Engine& engine, const std::vector<int32_t>& prompt,
                                          const GenerateOptions& options);

}  // namespace flotilla
