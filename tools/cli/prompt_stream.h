// One closed-loop stream's prompts for `flotilla bench serve`, one request
// at a time, for the workloads whose prompts build on earlier ones
// (multi_turn_workload.h, prefix_tenants_workload.h).
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace flotilla::cli {

class PromptStream {
 public:
  virtual ~PromptStream() = default;
  // The next request's prompt token ids.
  virtual const std::vector<int32_t>& Next(std::mt19937_64& rng) = 0;
  // Of the prompt Next() last returned: its turn in its conversation (from
  // 1) and how many of its leading tokens earlier requests sent too.
  virtual int turn() const = 0;
  virtual int64_t shared_tokens() const = 0;
  // The tokens that request generated; a failed one (ok = false) ends its
  // conversation.
  virtual void Done(const std::vector<int32_t>& output, bool ok) = 0;
};

// A conversation whose every turn is the last prompt, its output and new
// tokens (Next is the kind's); Done keeps the output while the conversation
// goes on.
class GrowingConversation : public PromptStream {
 public:
  int turn() const override { return turn_; }
  int64_t shared_tokens() const override { return shared_; }
  void Done(const std::vector<int32_t>& output, bool ok) override {
    if (turn_ == 0) return;
    continues_ = ok;
    if (ok) prompt_.insert(prompt_.end(), output.begin(), output.end());
  }

 protected:
  std::vector<int32_t> prompt_;  // the last prompt, then with its output appended
  int turn_ = 0;                 // 0 until the first Next()
  int64_t shared_ = 0;
  bool continues_ = false;  // the last turn finished well: the next one builds on it
};

}  // namespace flotilla::cli
