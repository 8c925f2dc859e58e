// Per-step cost of structured-output masks over the o200k vocabulary: a
// "model" drawing uniformly among the allowed tokens runs constrained turns;
// every Mask() call is timed, split into cache misses (computed) and hits.
// Prints one JSON line per schema.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <vector>

#include "common/grammar/o200k_vocabulary.h"
#include "common/grammar/output_constraint.h"

namespace {

using flotilla::grammar::ConstraintSpec;
using flotilla::grammar::OutputConstraint;
using Clock = std::chrono::steady_clock;

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(q * (v.size() - 1))];
}

void Run(const char* name, const ConstraintSpec& spec,
         std::shared_ptr<const flotilla::grammar::VocabularyIndex> index) {
  std::mt19937 rng(1);
  std::vector<double> all_us;
  int tokens = 0;
  for (int turn = 0; turn < 5; ++turn) {
    auto c = OutputConstraint::Create(spec, index);
    if (!c.ok()) {
      std::printf("{\"schema\": \"%s\", \"error\": \"%s\"}\n", name, c.status().ToString().c_str());
      return;
    }
    for (int step = 0; step < 400 && !(*c)->complete(); ++step) {
      const auto t0 = Clock::now();
      const uint32_t* mask = (*c)->Mask();
      all_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
      std::vector<int32_t> allowed;
      for (int32_t t = 0; t < index->vocab().vocab_size; ++t) {
        if (flotilla::grammar::TestBit(mask, t)) allowed.push_back(t);
      }
      if (allowed.empty() || !(*c)->Advance(allowed[rng() % allowed.size()]).ok()) break;
      ++tokens;
    }
  }
  std::printf(
      "{\"schema\": \"%s\", \"vocab\": %d, \"steps\": %zu, \"mask_us_p50\": %.1f, "
      "\"mask_us_p90\": %.1f, \"mask_us_p99\": %.1f, \"mask_us_max\": %.1f}\n",
      name, index->vocab().vocab_size, all_us.size(), Percentile(all_us, 0.5),
      Percentile(all_us, 0.9), Percentile(all_us, 0.99), Percentile(all_us, 1.0));
}

}  // namespace

int main() {
  auto index = flotilla::grammar::LoadO200kIndex(201088);
  if (!index.ok()) {
    std::fprintf(stderr, "%s\n", index.status().ToString().c_str());
    return 1;
  }
  ConstraintSpec object;
  object.json_final = true;
  object.reasoning_budget = 16;
  Run("json_object", object, *index);
  ConstraintSpec person = object;
  person.final_schema = R"({"type": "object", "properties": {"name": {"type": "string", "maxLength": 24},
      "age": {"type": "integer", "minimum": 0, "maximum": 120}, "tags": {"type": "array",
      "items": {"enum": ["a", "b", "c"]}, "maxItems": 4}, "bio": {"type": "string"}},
      "required": ["name", "age", "tags"], "additionalProperties": false})";
  Run("person_with_bounds", person, *index);
  ConstraintSpec tool;
  tool.tool_required = true;
  tool.tools.push_back({"get_weather", R"({"type": "object", "properties": {"city": {"type": "string",
      "maxLength": 16}, "days": {"type": "integer", "minimum": 1, "maximum": 14}},
      "required": ["city", "days"], "additionalProperties": false})", true});
  Run("required_tool_call", tool, *index);
  // anyOf alternatives that begin alike: the matcher reads them side by side.
  ConstraintSpec joint = object;
  joint.final_schema = R"({"anyOf": [{"type": "object", "properties": {"id": {"type": "integer",
      "minimum": 0, "maximum": 999}, "name": {"type": "string", "maxLength": 16}},
      "required": ["id", "name"]}, {"type": "object", "properties": {"id": {"type": "number"},
      "tags": {"type": "array", "items": {"anyOf": [{"type": "string", "maxLength": 8},
      {"enum": ["alpha", "beta"]}]}, "maxItems": 3}}, "required": ["id", "tags"]}]})";
  Run("anyof_alike_objects", joint, *index);
  // Patterns and formats: a string's state is an automaton state; zod's
  // email pattern beside the format is intersected with it.
  ConstraintSpec formats = object;
  formats.final_schema = R"({"type": "object", "properties": {"id": {"type": "string", "format": "uuid"},
      "at": {"type": "string", "format": "date-time"}, "site": {"type": "string", "format": "uri",
      "maxLength": 40}, "mail": {"type": "string", "format": "email", "maxLength": 40, "pattern":
      "^(?!\\.)(?!.*\\.\\.)([A-Za-z0-9_'+\\-\\.]*)[A-Za-z0-9_+-]@([A-Za-z0-9][A-Za-z0-9\\-]*\\.)+[A-Za-z]{2,}$"}},
      "required": ["id", "at", "site", "mail"], "additionalProperties": false})";
  Run("formats_and_patterns", formats, *index);
  ConstraintSpec record = object;
  record.final_schema = R"({"type": "object", "propertyNames": {"pattern": "^[a-z]{1,8}$"},
      "additionalProperties": {"type": "integer", "multipleOf": 5}, "maxProperties": 4})";
  Run("record_pattern_keys", record, *index);
  return 0;
}
