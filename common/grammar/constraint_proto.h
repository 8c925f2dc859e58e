// ConstraintSpec <-> cluster.proto's OutputConstraint (the coordinator sends
// it with the request; the worker compiles it).
#pragma once

#include "common/grammar/output_constraint.h"
#include "proto/cluster.pb.h"

namespace flotilla::grammar {

void ToProto(const ConstraintSpec& spec, cluster::OutputConstraint* out);
ConstraintSpec FromProto(const cluster::OutputConstraint& proto);

}  // namespace flotilla::grammar
