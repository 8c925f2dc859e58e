#include "coordinator/structured/chat_constraint.h"

#include "absl/strings/str_cat.h"

namespace flotilla::structured {
namespace {

using Json = nlohmann::json;

absl::Status Invalid(const std::string& field, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
}

// Compiles now so that the error names the request's field.
absl::Status CheckSchema(const Json& schema, const std::string& field) {
  grammar::ConstraintSpec probe;
  probe.json_final = true;
  probe.final_schema = schema.dump();
  absl::Status st = grammar::CheckSpec(probe);
  if (st.ok()) return st;
  std::string message(st.message());
  const std::string prefix = "response_format schema: ";
  if (message.rfind(prefix, 0) == 0) message = message.substr(prefix.size());
  return Invalid(field, message);
}

absl::Status ReadResponseFormat(const Json& body, grammar::ConstraintSpec* spec) {
  auto it = body.find("response_format");
  if (it == body.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_object()) return Invalid("response_format", "must be an object");
  auto type = it->find("type");
  if (type == it->end() || !type->is_string()) {
    return Invalid("response_format.type", "is required: \"text\", \"json_object\" or \"json_schema\"");
  }
  const std::string t = type->get<std::string>();
  if (t == "text") return absl::OkStatus();
  if (t == "json_object") {
    spec->json_final = true;
    return absl::OkStatus();
  }
  if (t != "json_schema") {
    return Invalid("response_format.type",
                   absl::StrCat("must be \"text\", \"json_object\" or \"json_schema\", not '", t, "'"));
  }
  auto js = it->find("json_schema");
  if (js == it->end() || !js->is_object()) {
    return Invalid("response_format.json_schema", "is required (an object with a schema)");
  }
  auto schema = js->find("schema");
  if (schema == js->end() || !schema->is_object()) {
    return Invalid("response_format.json_schema.schema", "is required (a JSON Schema object)");
  }
  if (auto strict = js->find("strict"); strict != js->end() && !strict->is_null() && !strict->is_boolean()) {
    return Invalid("response_format.json_schema.strict", "must be a boolean");
  }
  if (absl::Status st = CheckSchema(*schema, "response_format.json_schema.schema"); !st.ok()) return st;
  spec->json_final = true;
  spec->final_schema = schema->dump();
  return absl::OkStatus();
}

// A tool as the constraint sees it, with where it is in the request.
struct RequestTool {
  grammar::ConstraintSpec::Tool tool;
  std::string where;  // "tools[i].function"
};

// The tools' names, parameter schemas and strict flags (the rest of the
// tools' validation is the Harmony mapping's). Schemas are compiled later,
// and only those of tools whose calls are constrained: a tool the model is
// merely told about may use any JSON Schema.
absl::Status ReadTools(const Json& body, std::vector<RequestTool>* tools, bool* any_strict) {
  auto it = body.find("tools");
  if (it == body.end() || !it->is_array()) return absl::OkStatus();
  for (size_t i = 0; i < it->size(); ++i) {
    // Malformed tools are the Harmony mapping's to report.
    const Json& tool_json = (*it)[i];
    if (!tool_json.is_object() || !tool_json.contains("function")) continue;
    const Json& fn = tool_json["function"];
    if (!fn.is_object() || !fn.contains("name") || !fn["name"].is_string()) continue;
    RequestTool t;
    t.where = absl::StrCat("tools[", i, "].function");
    t.tool.name = fn["name"].get<std::string>();
    const Json params = fn.value("parameters", Json());
    if (!params.is_null()) t.tool.schema = params.dump();
    const Json strict = fn.value("strict", Json());
    if (!strict.is_null() && !strict.is_boolean()) return Invalid(t.where + ".strict", "must be a boolean");
    t.tool.constrained = strict.is_boolean() && strict.get<bool>();
    *any_strict = *any_strict || t.tool.constrained;
    tools->push_back(std::move(t));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::optional<grammar::ConstraintSpec>> ChatConstraint(const Json& body,
                                                                      int64_t max_tokens) {
  grammar::ConstraintSpec spec;
  if (absl::Status st = ReadResponseFormat(body, &spec); !st.ok()) return st;
  std::vector<RequestTool> tools;
  bool any_strict = false;
  if (absl::Status st = ReadTools(body, &tools, &any_strict); !st.ok()) return st;
  const Json choice = body.value("tool_choice", Json());
  if (choice.is_string() && choice == "required") {
    spec.tool_required = true;
  } else if (choice.is_object()) {
    const Json fn = choice.contains("function") ? choice["function"] : Json();
    const std::string name =
        fn.is_object() && fn.contains("name") && fn["name"].is_string() ? fn["name"].get<std::string>() : "";
    std::erase_if(tools, [&](const RequestTool& t) { return t.tool.name != name; });
    spec.tool_required = true;
  } else if (choice.is_string() && choice == "none") {
    tools.clear();
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
        if (absl::Status st = CheckSchema(Json::parse(t.tool.schema), t.where + ".parameters");
            !st.ok()) {
          return st;
        }
      }
      spec.tools.push_back(std::move(t.tool));
    }
  }
  spec.reasoning_budget = max_tokens > 0 ? max_tokens / 2 : kDefaultReasoningBudget;
  if (absl::Status st = grammar::CheckSpec(spec); !st.ok()) return Invalid("tools", std::string(st.message()));
  return spec;
}

}  // namespace flotilla::structured
