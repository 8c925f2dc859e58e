#include "worker/speculative_drafter.h"

#include <algorithm>

#include "worker/ngram_drafter.h"

namespace flotilla::worker {

SpeculativeDrafter::SpeculativeDrafter(const SpeculativeConfig& config, DraftMemory* memory,
                                       absl::Span<const int32_t> prompt,
                                       const SamplingParams& params, uint64_t salt, int vocab)
    : config_(config),
      memory_(memory),
      context_(prompt.begin(), prompt.end()),
      prompt_size_(prompt.size()),
      salt_(salt),
      vocab_(vocab) {
  // A worker that allows replay records every deterministic request, so a
  // benchmark's warm-up pass may run with speculation off.
  if (config_.allow_replay) replay_key_ = ReplayKey(prompt, params);
  if (config_.method == SpeculativeMethod::kSuffix) {
    own_ = std::make_unique<SuffixIndex>();
    own_->Add(prompt);
  }
  if (config_.method == SpeculativeMethod::kEagle3 && memory_->eagle3 != nullptr) {
    eagle3_ = std::make_unique<Eagle3Drafter>(memory_->eagle3.get(), memory_->pool);
  }
}

void SpeculativeDrafter::AddHidden(int64_t first, const float* rows, int64_t n) {
  if (eagle3_ != nullptr) eagle3_->AddHidden(first, rows, n);
}

std::vector<int32_t> SpeculativeDrafter::Propose(absl::Span<const int32_t> generated,
                                                 int64_t limit) {
  const int k = static_cast<int>(std::min<int64_t>(config_.num_tokens, limit));
  if (k <= 0) return {};
  // The context grows by what was generated since the last call.
  const size_t known = context_.size() - prompt_size_;
  if (generated.size() > known) {
    const absl::Span<const int32_t> added = generated.subspan(known);
    context_.insert(context_.end(), added.begin(), added.end());
    if (own_ != nullptr) own_->Extend(added);
  }
  switch (config_.method) {
    case SpeculativeMethod::kNgram:
      return ProposeNgramDraft(context_, config_.lookup_min, config_.lookup_max, k);
    case SpeculativeMethod::kSuffix: {
      const SuffixIndex* indexes[] = {own_.get(), &memory_->recent_outputs};
      return ProposeSuffixDraft(indexes, context_, k);
    }
    case SpeculativeMethod::kReplay: {
      const std::vector<int32_t>* recorded = memory_->recordings.Find(replay_key_);
      if (recorded == nullptr) return {};
      return ProposeReplayDraft(*recorded, generated, k, config_.replay_error_rate, salt_, vocab_);
    }
    case SpeculativeMethod::kEagle3:
      return eagle3_ == nullptr ? std::vector<int32_t>{} : eagle3_->Propose(context_, k);
    case SpeculativeMethod::kOff:
      break;
  }
  return {};
}

void SpeculativeDrafter::Finish(absl::Span<const int32_t> generated) {
  if (config_.method == SpeculativeMethod::kSuffix) memory_->recent_outputs.Add(generated);
  if (config_.allow_replay) memory_->recordings.Record(replay_key_, generated);
}

}  // namespace flotilla::worker
