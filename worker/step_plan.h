// The step plan's conventions shared by the planner (Scheduler) and the
// ranks that run it (StepExecutor).
#pragma once

#include <cstdint>

namespace flotilla::worker {

// What a plan item asks of its logits (cluster::PlanItem::logits).
inline constexpr uint32_t kLogitsNone = 0, kLogitsLast = 1, kLogitsAll = 2;

}  // namespace flotilla::worker
