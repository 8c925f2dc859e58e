#include "worker/engine/generate.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/engine/stop_rules.h"

namespace flotilla {
namespace {

absl::StatusOr<GenerationResult> GenerateIn(Engine& engine, int64_t seq,
                                            const std::vector<int32_t>& prompt,
                                            const GenerateOptions& options) {
  const ModelConfig& c = engine.config();
  const int64_t V = c.vocab_size;
  FLOTILLA_ASSIGN_OR_RETURN(std::unique_ptr<Sampler> sampler,
                            Sampler::Create(options.sampling, c.vocab_size));
  if (options.prefill_chunk < 0) {
    return absl::InvalidArgumentError("prefill_chunk must be >= 0");
  }
  if (static_cast<int64_t>(prompt.size()) > engine.MaxSequenceLength()) {
    return absl::InvalidArgumentError(
        absl::StrCat("prompt of ", prompt.size(), " tokens is longer than the context (",
                     engine.MaxSequenceLength(), " tokens: max_position_embeddings ",
                     c.max_position_embeddings, " and the KV cache capacity)"));
  }
  // A sequence ends at a stop token, after max_tokens, or when the context is
  // full: the last kept token need not fit, as it is never fed back.
  const int64_t room = engine.MaxSequenceLength() - static_cast<int64_t>(prompt.size()) + 1;
  const StopRules rules(
      options.sampling.stop_token_ids ? *options.sampling.stop_token_ids : c.eos_token_ids,
      std::min<int64_t>(options.sampling.max_tokens, room));

  GenerationResult result;
  result.prompt_tokens = static_cast<int64_t>(prompt.size());
  const int64_t chunk =
      options.prefill_chunk > 0 ? options.prefill_chunk : static_cast<int64_t>(prompt.size());
  std::vector<float> last;
  for (size_t begin = 0; begin < prompt.size(); begin += chunk) {
    const size_t end = std::min(prompt.size(), begin + chunk);
    StepItem item;
    item.sequence = seq;
    item.tokens.assign(prompt.begin() + begin, prompt.begin() + end);
    item.logits = options.return_prompt_logits ? LogitsMode::kAll
                  : end == prompt.size()       ? LogitsMode::kLast
                                               : LogitsMode::kNone;
    FLOTILLA_ASSIGN_OR_RETURN(StepOutput out, engine.Step({item}));
    if (options.return_prompt_logits) {
      result.prompt_logits.insert(result.prompt_logits.end(), out.logits[0].begin(),
                                  out.logits[0].end());
    }
    if (end == prompt.size()) last.assign(out.logits[0].end() - V, out.logits[0].end());
  }
  while (true) {
    TokenLogprob lp;
    const int32_t token = sampler->Sample(last.data(), options.sampling.logprobs ? &lp : nullptr);
    ++result.completion_tokens;
    if (options.sampling.logprobs) result.logprobs.push_back(lp);
    const StopDecision decision = rules.Check(token, static_cast<int64_t>(result.tokens.size()));
    if (decision == StopDecision::kStop) {
      result.finish_reason = "stop";
      result.stop_token = token;
      break;
    }
    result.tokens.push_back(token);
    if (decision == StopDecision::kLength) {
      result.finish_reason = "length";
      break;
    }
    FLOTILLA_ASSIGN_OR_RETURN(StepOutput out,
                              engine.Step({StepItem{seq, {token}, LogitsMode::kLast}}));
    last = std::move(out.logits[0]);
  }
  return result;
}

}  // namespace

absl::StatusOr<GenerationResult> Generate(Engine& engine, const std::vector<int32_t>& prompt,
                                          const GenerateOptions& options) {
  if (prompt.empty()) return absl::InvalidArgumentError("prompt is empty");
  const int64_t seq = engine.NewSequence();
  absl::StatusOr<GenerationResult> result = GenerateIn(engine, seq, prompt, options);
  // The sequence is ours; freeing it cannot fail.
  (void)engine.FreeSequence(seq);
  return result;
}

}  // namespace flotilla
