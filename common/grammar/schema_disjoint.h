// Whether two JSON Schemas can never both accept one value, judged from what
// they say (types, const / enum values, required properties that tell them
// apart), by the standard JSON Schema meaning of each keyword: the check that
// lets `oneOf` be enforced as `anyOf` (a value generated for one alternative
// then matches no other).
#pragma once

#include <nlohmann/json.hpp>

namespace flotilla::grammar {

// True only when no value satisfies both `a` and `b` ($refs resolved against
// `root`); false when that could not be shown (they may overlap).
bool ProvablyDisjoint(const nlohmann::ordered_json& a, const nlohmann::ordered_json& b,
                      const nlohmann::ordered_json& root);

}  // namespace flotilla::grammar
