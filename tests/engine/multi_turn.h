// A multi-turn workload for prefix-cache tests, over the Engine interface:
// each turn's prompt repeats the previous turn (its prompt, and with
// `keep_answers` its generated tokens) plus new tokens; each turn takes what
// it can from the prefix cache, prefills the rest in chunks and decodes
// greedily. Shared by the CPU and CUDA engine tests.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "worker/engine/engine.h"
#include "worker/engine/sampler.h"

namespace flotilla::testing {

struct MultiTurnOptions {
  int turns = 4;
  int first_prompt = 40;
  int new_tokens = 64;  // added by each later turn
  int generate = 6;     // greedy tokens per turn
  int prefill_chunk = 64;
  bool keep_answers = true;
  int vocab = 1024;
  uint32_t seed = 1;
  uint64_t cache_domain = 0;  // the turns' prefix-cache domain
};

struct TurnResult {
  std::vector<int32_t> prompt;
  int64_t cached = 0;    // prompt tokens taken from the prefix cache
  int64_t computed = 0;  // tokens the engine ran (prompt and decode)
  std::vector<int32_t> tokens;  // greedy tokens
  std::vector<float> first_logits;  // of the last prompt position
  std::vector<std::vector<float>> logits;  // per greedy token: the logits it was taken from
};

inline std::vector<int32_t> TurnTokens(int n, uint32_t seed, int vocab) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) {
    t[i] = static_cast<int32_t>((i * 7919u + seed * 104729u + 13u) % static_cast<uint32_t>(vocab));
  }
  return t;
}

inline TurnResult RunTurn(Engine& engine, const std::vector<int32_t>& prompt,
                          const MultiTurnOptions& o) {
  TurnResult r;
  r.prompt = prompt;
  r.cached = engine.CachedPrefixLength(prompt, o.cache_domain);
  auto seq = engine.NewSequenceWithPrefix({prompt.begin(), prompt.begin() + r.cached},
                                          o.cache_domain);
  EXPECT_TRUE(seq.ok()) << "NewSequenceWithPrefix(" << r.cached
                        << " cached tokens): " << seq.status();
  if (!seq.ok()) return r;
  EXPECT_EQ(*engine.SequenceLength(*seq), r.cached);
  const int64_t V = engine.config().vocab_size;
  std::vector<float> logits;
  for (int64_t b = r.cached; b < static_cast<int64_t>(prompt.size()); b += o.prefill_chunk) {
    const int64_t end = std::min<int64_t>(prompt.size(), b + o.prefill_chunk);
    auto out = engine.Step({StepItem{*seq, {prompt.begin() + b, prompt.begin() + end},
                                     LogitsMode::kLast}});
    EXPECT_TRUE(out.ok()) << out.status();
    if (!out.ok()) return r;
    r.computed += end - b;
    logits = out->logits[0];
  }
  r.first_logits = logits;
  for (int i = 0; i < o.generate; ++i) {
    const int32_t token = Argmax(logits.data(), V);
    r.tokens.push_back(token);
    r.logits.push_back(logits);
    if (i + 1 == o.generate) break;
    auto out = engine.Step({StepItem{*seq, {token}, LogitsMode::kLast}});
    EXPECT_TRUE(out.ok()) << out.status();
    if (!out.ok()) return r;
    r.computed += 1;
    logits = out->logits[0];
  }
  EXPECT_TRUE(engine.FreeSequence(*seq).ok());
  return r;
}

inline std::vector<TurnResult> RunTurns(Engine& engine, const MultiTurnOptions& o) {
  std::vector<TurnResult> results;
  std::vector<int32_t> prompt = TurnTokens(o.first_prompt, o.seed, o.vocab);
  for (int t = 0; t < o.turns; ++t) {
    results.push_back(RunTurn(engine, prompt, o));
    if (o.keep_answers) {
      prompt.insert(prompt.end(), results.back().tokens.begin(), results.back().tokens.end());
    }
    std::vector<int32_t> more = TurnTokens(o.new_tokens, o.seed * 31 + t + 1, o.vocab);
    prompt.insert(prompt.end(), more.begin(), more.end());
  }
  return results;
}

}  // namespace flotilla::testing
