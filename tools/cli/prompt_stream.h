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

}  // namespace flotilla::cli
