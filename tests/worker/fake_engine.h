// A scriptable engine for worker tests: sequences are token lists, a step
// appends the items' tokens and draws, for items with a sampler, the token
// `next_token` chooses (by default the last token + 1). KV accounting in
// blocks of `block_size` tokens over `total_blocks`. Records every call.
#pragma once

#include <algorithm>
#include <functional>
#include <map>
#include <vector>

#include "common/model_config.h"
#include "worker/engine/engine.h"

namespace flotilla::worker {

class FakeEngine : public Engine {
 public:
  explicit FakeEngine(ModelConfig config = ModelConfig::Tiny(), int64_t total_blocks = 64,
                      int64_t block_size = 4, int64_t max_length = 256)
      : config_(std::move(config)),
        total_blocks_(total_blocks),
        block_size_(block_size),
        max_length_(max_length) {}

  // The token drawn for `sequence` whose tokens so far are `tokens`.
  std::function<int32_t(int64_t sequence, const std::vector<int32_t>& tokens)> next_token =
      [](int64_t, const std::vector<int32_t>& tokens) { return tokens.back() + 1; };
  // What CachedPrefixLength answers.
  int64_t cached_prefix = 0;
  // > 0: a second KV pool of that many blocks, where a sequence holds at
  // most `window_pool_bound` blocks (as a sliding-window pool does).
  int64_t window_pool_blocks = 0;
  int64_t window_pool_bound = 2;
  // Not OK: every Step fails with it.
  absl::Status step_error;
  // What SplitsGroupLogits answers (a rank of a TP group on a device).
  bool splits_group_logits = false;
  // Called with every Step's items (on the stepping thread), for records that
  // must outlive the engine.
  std::function<void(const std::vector<StepItem>&)> on_step;

  std::vector<std::vector<StepItem>> steps;   // every Step's items (samplers included)
  std::vector<int64_t> instance_step_tokens;  // every SetInstanceStepTokens
  std::vector<int64_t> freed;
  std::map<int64_t, std::vector<int32_t>> sequences;
  std::map<int64_t, uint64_t> cache_domains;  // each sequence's, as created
  // Every CachedPrefixLength's domain.
  mutable std::vector<uint64_t> prefix_queries;

  int64_t NewSequence() override {
    sequences[next_id_] = {};
    return next_id_++;
  }
  absl::StatusOr<int64_t> NewSequenceWithPrefix(const std::vector<int32_t>& prefix,
                                                uint64_t cache_domain) override {
    const int64_t id = NewSequence();
    sequences[id] = prefix;
    cache_domains[id] = cache_domain;
    return id;
  }
  absl::Status FreeSequence(int64_t sequence) override {
    if (sequences.erase(sequence) == 0) return absl::InvalidArgumentError("unknown sequence");
    freed.push_back(sequence);
    return absl::OkStatus();
  }
  absl::StatusOr<int64_t> SequenceLength(int64_t sequence) const override {
    auto it = sequences.find(sequence);
    if (it == sequences.end()) return absl::InvalidArgumentError("unknown sequence");
    return static_cast<int64_t>(it->second.size());
  }
  absl::Status Validate(const std::vector<StepItem>& items) const override {
    for (const StepItem& item : items) {
      if (!sequences.count(item.sequence)) return absl::InvalidArgumentError("unknown sequence");
    }
    return absl::OkStatus();
  }
  bool SplitsGroupLogits() const override { return splits_group_logits; }
  absl::StatusOr<StepOutput> Step(const std::vector<StepItem>& items) override {
    if (!step_error.ok()) return step_error;
    if (absl::Status valid = Validate(items); !valid.ok()) return valid;
    steps.push_back(items);
    if (on_step) on_step(items);
    StepOutput out;
    for (const StepItem& item : items) {
      std::vector<int32_t>& tokens = sequences[item.sequence];
      tokens.insert(tokens.end(), item.tokens.begin(), item.tokens.end());
      const int64_t rows = item.logits == LogitsMode::kAll    ? item.tokens.size()
                           : item.logits == LogitsMode::kLast ? 1
                                                              : 0;
      out.logits.emplace_back(rows * config_.vocab_size, 0.5f);
      TokenLogprob drawn;
      drawn.token = -1;
      if (item.sampler != nullptr) {
        drawn.token = next_token(item.sequence, tokens);
        drawn.logprob = -0.25f;
        item.sampler->Record(drawn.token);
      }
      out.sampled.push_back(drawn);
    }
    return out;
  }
  void SetInstanceStepTokens(int64_t max_tokens_any_rank) override {
    instance_step_tokens.push_back(max_tokens_any_rank);
  }
  int64_t MaxSequenceLength() const override { return max_length_; }
  const ModelConfig& config() const override { return config_; }
  int64_t KvTotalBlocks() const override { return total_blocks_; }
  int64_t KvFreeBlocks() const override {
    int64_t used = 0;
    for (const auto& [id, tokens] : sequences) used += KvBlocksForLength(tokens.size());
    return total_blocks_ - used;
  }
  int64_t KvBlocksForLength(int64_t tokens) const override {
    return (tokens + block_size_ - 1) / block_size_;
  }
  std::vector<int64_t> KvPoolAdmissionBlocks() const override {
    if (window_pool_blocks == 0) return {total_blocks_};
    return {total_blocks_, window_pool_blocks};
  }
  std::vector<int64_t> KvPoolBlocksForLength(int64_t tokens) const override {
    if (window_pool_blocks == 0) return {KvBlocksForLength(tokens)};
    return {KvBlocksForLength(tokens), std::min(KvBlocksForLength(tokens), window_pool_bound)};
  }
  int64_t CachedPrefixLength(const std::vector<int32_t>&, uint64_t cache_domain) const override {
    prefix_queries.push_back(cache_domain);
    return cached_prefix;
  }

 private:
  ModelConfig config_;
  int64_t total_blocks_, block_size_, max_length_;
  int64_t next_id_ = 0;
};

}  // namespace flotilla::worker
