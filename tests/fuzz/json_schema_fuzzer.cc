// Fuzz target: structured outputs from the client's JSON Schema to the
// tokens a worker may draw. Input: a flags byte, a walk byte, then the schema
// text.
//   flags bits 0-1: where the schema goes: 0 the response format (final
//     message is JSON of it), 1 a tool's parameters beside free text, 2 a
//     tool's parameters with tool_choice "required", 3 both (the schema as
//     response format and as a required tool's parameters);
//   flags bit 2: reasoning allowed (a budget of 4 analysis tokens);
//   the walk byte seeds which allowed token each step takes.
// Code under test: CheckSpec (what the coordinator runs to refuse a request
// early), OutputConstraint::Create, Mask, Advance, Forced and
// AcceptedPrefix (what the worker runs every step) over the o200k
// vocabulary.
// Properties: CheckSpec answers OK or INVALID_ARGUMENT; a spec it accepts
// compiles; every token a mask allows is taken (AcceptedPrefix 1, Advance
// OK) and one it refuses is not; the first piece Forced names is allowed by
// the mask (its first byte's token, or the special token).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/grammar/o200k_vocabulary.h"
#include "common/grammar/output_constraint.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

using flotilla::grammar::ConstraintSpec;
using flotilla::grammar::OutputConstraint;
using flotilla::grammar::TestBit;
using flotilla::grammar::VocabularyIndex;

constexpr int kVocabSize = 201088;
constexpr int kSteps = 24;

struct Vocabulary {
  std::shared_ptr<const VocabularyIndex> index;
  std::vector<int32_t> byte_token;  // the token of each single byte, -1 if none
};

const Vocabulary& SharedVocabulary() {
  static const Vocabulary* v = [] {
    auto index = flotilla::grammar::LoadO200kIndex(kVocabSize);
    if (!index.ok()) {
      std::fprintf(stderr, "fuzz: cannot load the o200k vocabulary: %s\n",
                   std::string(index.status().message()).c_str());
      std::abort();
    }
    auto* out = new Vocabulary{*index, std::vector<int32_t>(256, -1)};
    const auto& bytes = out->index->vocab().bytes;
    for (int32_t t = 0; t < static_cast<int32_t>(bytes.size()); ++t) {
      if (bytes[t].size() == 1) out->byte_token[static_cast<uint8_t>(bytes[t][0])] = t;
    }
    return out;
  }();
  return *v;
}

ConstraintSpec SpecOf(uint8_t flags, const std::string& schema) {
  ConstraintSpec spec;
  const int slot = flags & 3;
  if (slot == 0 || slot == 3) {
    spec.json_final = true;
    spec.final_schema = schema;
  }
  if (slot != 0) spec.tools.push_back({"f", schema, true});
  spec.tool_required = slot >= 2;
  spec.reasoning_budget = (flags & 4) ? 4 : 0;
  return spec;
}

// The first piece Forced names is allowed by the current mask.
void CheckForced(const OutputConstraint& c, const Vocabulary& v, const uint32_t* mask) {
  const std::vector<flotilla::grammar::ForcedPiece> forced = c.Forced(16);
  if (forced.empty()) return;
  const auto& first = forced.front();
  const int32_t token =
      first.special >= 0 ? first.special : v.byte_token[static_cast<uint8_t>(first.bytes[0])];
  FLOTILLA_FUZZ_CHECK(token >= 0);
  FLOTILLA_FUZZ_CHECK(TestBit(mask, token));
  FLOTILLA_FUZZ_CHECK(c.AcceptedPrefix({token}) == 1);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const Vocabulary& v = SharedVocabulary();
  const ConstraintSpec spec =
      SpecOf(data[0], std::string(reinterpret_cast<const char*>(data + 2), size - 2));
  const absl::Status checked = flotilla::grammar::CheckSpec(spec);
  FLOTILLA_FUZZ_CHECK(checked.ok() || checked.code() == absl::StatusCode::kInvalidArgument);
  if (!checked.ok()) return 0;
  auto created = OutputConstraint::Create(spec, v.index);
  FLOTILLA_FUZZ_CHECK(created.ok());
  OutputConstraint& c = **created;
  std::mt19937 rng(data[1]);
  std::vector<int32_t> allowed, refused;
  for (int step = 0; step < kSteps && !c.complete(); ++step) {
    const uint32_t* mask = c.Mask();
    FLOTILLA_FUZZ_CHECK(mask != nullptr);
    allowed.clear();
    refused.clear();
    for (int32_t t = 0; t < kVocabSize; ++t) (TestBit(mask, t) ? allowed : refused).push_back(t);
    if (allowed.empty()) return 0;  // a schema no text satisfies: the worker ends the request
    CheckForced(c, v, mask);
    const int32_t no = refused.empty() ? -1 : refused[rng() % refused.size()];
    if (no >= 0) FLOTILLA_FUZZ_CHECK(c.AcceptedPrefix({no}) == 0);
    const int32_t yes = allowed[rng() % allowed.size()];
    FLOTILLA_FUZZ_CHECK(c.AcceptedPrefix({yes}) == 1);
    FLOTILLA_FUZZ_CHECK(c.Advance(yes).ok());
  }
  return 0;
}
