// Structured outputs of a chat-completions request: `response_format`
// (text | json_object | json_schema), and the tool calls `tool_choice`
// ("required" or a named function) or `strict: true` tools ask for, turned
// into the constraint the worker decodes under. Every schema is compiled
// here, so an unsupported feature is a 400 naming it before any work.
#pragma once

#include <cstdint>
#include <optional>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "common/grammar/output_constraint.h"

namespace flotilla::structured {

// Reasoning budget when the request sets no max_tokens.
inline constexpr int64_t kDefaultReasoningBudget = 2048;

// nullopt: nothing to constrain. Errors are INVALID_ARGUMENT "FIELD: what".
// `max_tokens`: the request's (0 = none); reasoning may use half of it.
absl::StatusOr<std::optional<grammar::ConstraintSpec>> ChatConstraint(const nlohmann::json& body,
                                                                      int64_t max_tokens);

}  // namespace flotilla::structured
