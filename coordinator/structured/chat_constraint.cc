#include "coordinator/structured/chat_constraint.h"

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"

namespace flotilla::structured {
namespace {

absl::Status ConstraintError(const std::string& field, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
}

// A schema as the worker compiles it: its keys in the request's order, since
// an object's properties are generated in their declared order.
std::string SchemaText(const nlohmann::ordered_json& schema) { return schema.dump(); }

// Compiles now so that the error names the request's field.
absl::Status CheckSchema(const std::string& schema, const std::string& field) {
  grammar::ConstraintSpec probe;
  probe.json_final = true;
  probe.final_schema = schema;
  absl::Status st = grammar::CheckSpec(probe);
  if (st.ok()) return st;
  std::string message(st.message());
  const std::string prefix = "response_format schema: ";
  if (message.rfind(prefix, 0) == 0) message = message.substr(prefix.size());
  return ConstraintError(field, message);
}

absl::Status ApplyResponseFormat(const harmony::ChatConversation& conversation,
                                 grammar::ConstraintSpec& spec) {
  if (!conversation.response_format) return absl::OkStatus();
  const harmony::ChatResponseFormat& format = *conversation.response_format;
  switch (format.type) {
    case harmony::ChatResponseFormat::Type::kText:
      return absl::OkStatus();
    case harmony::ChatResponseFormat::Type::kJsonObject:
      spec.json_final = true;
      return absl::OkStatus();
    case harmony::ChatResponseFormat::Type::kJsonSchema:
      break;
  }
  const std::string schema = SchemaText(format.schema);
  if (absl::Status st = CheckSchema(schema, format.schema_field); !st.ok()) return st;
  spec.json_final = true;
  spec.final_schema = schema;
  return absl::OkStatus();
}

// A tool as the constraint sees it, with the field of its schema.
struct RequestTool {
  grammar::ConstraintSpec::Tool tool;
  std::string parameters_field;
};

}  // namespace

absl::StatusOr<std::optional<grammar::ConstraintSpec>> ChatConstraint(
    const harmony::ChatConversation& conversation, int64_t max_tokens) {
  grammar::ConstraintSpec spec;
  if (absl::Status st = ApplyResponseFormat(conversation, spec); !st.ok()) return st;
  // Schemas are compiled only for the tools whose calls are constrained: a
  // tool the model is merely told about may use any JSON Schema.
  std::vector<RequestTool> tools;
  bool any_strict = false;
  for (const harmony::ChatTool& t : conversation.tools) {
    RequestTool rt;
    rt.tool.name = t.name;
    if (t.parameters && !t.parameters->is_null()) rt.tool.schema = SchemaText(*t.parameters);
    rt.tool.constrained = t.strict;
    rt.parameters_field = t.parameters_field;
    any_strict = any_strict || t.strict;
    tools.push_back(std::move(rt));
  }
  using Mode = harmony::ChatToolChoice::Mode;
  switch (conversation.tool_choice.mode) {
    case Mode::kAuto:
      break;
    case Mode::kNone:
      tools.clear();
      break;
    case Mode::kRequired:
      spec.tool_required = true;
      break;
    case Mode::kFunction:
      std::erase_if(tools, [&](const RequestTool& t) {
        return t.tool.name != conversation.tool_choice.function;
      });
      spec.tool_required = true;
      break;
  }
  if (spec.tool_required) {
    // No tool to call: the Harmony mapping refuses the request, naming tool_choice.
    if (tools.empty()) return std::nullopt;
    for (RequestTool& t : tools) t.tool.constrained = true;  // a forced call's arguments always conform
  }
  const bool constrain_tools = spec.tool_required || any_strict;
  if (!spec.json_final && !constrain_tools) return std::nullopt;
  if (constrain_tools) {
    for (RequestTool& t : tools) {
      if (t.tool.constrained && !t.tool.schema.empty()) {
        if (absl::Status st = CheckSchema(t.tool.schema, t.parameters_field); !st.ok()) return st;
      }
      spec.tools.push_back(std::move(t.tool));
    }
  }
  spec.reasoning_budget = max_tokens > 0 ? max_tokens / 2 : kDefaultReasoningBudget;
  if (absl::Status st = grammar::CheckSpec(spec); !st.ok()) {
    return ConstraintError("tools", std::string(st.message()));
  }
  return spec;
}

}  // namespace flotilla::structured
