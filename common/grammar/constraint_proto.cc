#include "common/grammar/constraint_proto.h"

namespace flotilla::grammar {

void ToProto(const ConstraintSpec& spec, cluster::OutputConstraint* out) {
  out->set_json_final(spec.json_final);
  out->set_final_schema_json(spec.final_schema);
  for (const ConstraintSpec::Tool& tool : spec.tools) {
    cluster::OutputConstraint::Tool* t = out->add_tools();
    t->set_name(tool.name);
    t->set_schema_json(tool.schema);
    t->set_constrained(tool.constrained);
  }
  out->set_tool_required(spec.tool_required);
  out->set_reasoning_budget(static_cast<uint32_t>(spec.reasoning_budget));
}

ConstraintSpec FromProto(const cluster::OutputConstraint& proto) {
  ConstraintSpec spec;
  spec.json_final = proto.json_final();
  spec.final_schema = proto.final_schema_json();
  for (const cluster::OutputConstraint::Tool& t : proto.tools()) {
    spec.tools.push_back({t.name(), t.schema_json(), t.constrained()});
  }
  spec.tool_required = proto.tool_required();
  spec.reasoning_budget = proto.reasoning_budget();
  return spec;
}

}  // namespace flotilla::grammar
