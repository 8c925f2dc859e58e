#include "worker/prefill_policy.h"

#include <algorithm>
#include <limits>
#include <numeric>
#include <string>

#include "absl/strings/str_cat.h"

namespace flotilla::worker {
namespace {

constexpr std::string_view kFcfsName = "fcfs";
constexpr std::string_view kShortestName = "shortest-prompt-first";

// The candidates' indices in the order the policy serves them.
std::vector<size_t> ServeOrder(const PrefillPolicy& policy,
                               const std::vector<PrefillCandidate>& candidates, uint64_t now_ms) {
  std::vector<size_t> order(candidates.size());
  std::iota(order.begin(), order.end(), size_t{0});
  auto by_arrival = [&](size_t a, size_t b) {
    const PrefillCandidate &x = candidates[a], &y = candidates[b];
    return x.arrived_ms != y.arrived_ms ? x.arrived_ms < y.arrived_ms : x.request_id < y.request_id;
  };
  if (policy.order == PrefillOrder::kFcfs) {
    std::sort(order.begin(), order.end(), by_arrival);
    return order;
  }
  auto overdue = [&](size_t i) {
    return policy.max_prefill_wait_ms > 0 &&
           now_ms >= candidates[i].arrived_ms + policy.max_prefill_wait_ms;
  };
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const bool late_a = overdue(a), late_b = overdue(b);
    if (late_a != late_b) return late_a;
    if (late_a || candidates[a].left == candidates[b].left) return by_arrival(a, b);
    return candidates[a].left < candidates[b].left;
  });
  return order;
}

}  // namespace

absl::StatusOr<PrefillOrder> ParsePrefillOrder(std::string_view name) {
  if (name == kFcfsName) return PrefillOrder::kFcfs;
  if (name == kShortestName) return PrefillOrder::kShortestPromptFirst;
  return absl::InvalidArgumentError(absl::StrCat("unknown prefill order \"", std::string(name),
                                                 "\" (fcfs or shortest-prompt-first)"));
}

std::string_view PrefillOrderName(PrefillOrder order) {
  return order == PrefillOrder::kFcfs ? kFcfsName : kShortestName;
}

absl::StatusOr<PrefillPolicy> PrefillPolicyFromProto(const cluster::SchedulerPolicy& proto) {
  PrefillPolicy policy;
  switch (proto.prefill_order()) {
    case cluster::PREFILL_ORDER_UNSPECIFIED:
    case cluster::PREFILL_ORDER_FCFS:
      policy.order = PrefillOrder::kFcfs;
      break;
    case cluster::PREFILL_ORDER_SHORTEST_PROMPT_FIRST:
      policy.order = PrefillOrder::kShortestPromptFirst;
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "scheduler_policy: unknown prefill_order ", static_cast<int>(proto.prefill_order())));
  }
  policy.max_partial_prefills = proto.max_num_partial_prefills();
  policy.max_long_partial_prefills = proto.max_long_partial_prefills();
  policy.long_prefill_token_threshold = proto.long_prefill_token_threshold();
  policy.max_prefill_wait_ms = proto.max_prefill_wait_ms();
  return policy;
}

std::vector<PrefillChunk> PlanPrefill(const PrefillPolicy& policy,
                                      const std::vector<PrefillCandidate>& candidates,
                                      int64_t budget, uint64_t now_ms,
                                      const std::function<int64_t(size_t)>& left_of) {
  std::vector<PrefillChunk> chunks;
  std::vector<int64_t> left_after;  // per chunk: its prompt's tokens not yet given
  const int64_t threshold = policy.long_prefill_token_threshold;
  int64_t long_prompts = 0;
  for (size_t i : ServeOrder(policy, candidates, now_ms)) {
    if (budget <= 0) break;
    if (policy.max_partial_prefills > 0 &&
        static_cast<int64_t>(chunks.size()) >= policy.max_partial_prefills) {
      break;
    }
    const bool is_long = threshold > 0 && candidates[i].prompt_tokens > threshold;
    if (is_long && policy.max_long_partial_prefills > 0 &&
        long_prompts >= policy.max_long_partial_prefills) {
      continue;
    }
    const int64_t left = left_of(i);
    if (left <= 0) continue;
    const int64_t cap = is_long ? threshold : std::numeric_limits<int64_t>::max();
    const int64_t n = std::min({left, budget, cap});
    chunks.push_back(PrefillChunk{i, n});
    left_after.push_back(left - n);
    budget -= n;
    if (is_long) ++long_prompts;
  }
  // The caps only make room for other prompts; what nobody else took goes
  // back to the capped ones.
  for (size_t c = 0; c < chunks.size() && budget > 0; ++c) {
    const int64_t more = std::min(left_after[c], budget);
    chunks[c].tokens += more;
    budget -= more;
  }
  return chunks;
}

}  // namespace flotilla::worker
