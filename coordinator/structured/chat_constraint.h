// Structured outputs of a chat request: its response format (text |
// json_object | json_schema), and the tool calls its tool_choice ("required"
// or a named function) or `strict` tools ask for, turned into the constraint
// the worker decodes under. Every schema is compiled here, so an unsupported
// feature is a 400 naming the request's field before any work.
#pragma once

#include <cstdint>
#include <optional>

#include "absl/status/statusor.h"
#include "common/grammar/output_constraint.h"
#include "common/harmony/chat_request.h"

namespace flotilla::structured {

// Reasoning budget when the request sets no max_tokens.
inline constexpr int64_t kDefaultReasoningBudget = 2048;

// nullopt: nothing to constrain. Errors are INVALID_ARGUMENT "FIELD: what",
// FIELD as the conversation names it (ChatTool::parameters_field,
// ChatResponseFormat::schema_field). `max_tokens`: the request's (0 = none);
// reasoning may use half of it.
absl::StatusOr<std::optional<grammar::ConstraintSpec>> ChatConstraint(
    const harmony::ChatConversation& conversation, int64_t max_tokens);

}  // namespace flotilla::structured
