// Model specs the synthetic-model parser refuses, each with words its error
// must hold: one list for the parser's test (tests/model) and the CLI's
// (tests/tools), so both refuse the same specs the same way.
#pragma once

namespace flotilla::testing_util {

struct BadSyntheticSpec {
  const char* spec;
  const char* problem;
};

inline constexpr BadSyntheticSpec kBadSyntheticSpecs[] = {
    {"synthetic:foo", "unknown preset 'foo'"},
    {"synthetic:", "unknown preset ''"},
    {"synthetic:tiny:x", "seed 'x' is not a non-negative"},
    {"synthetic:tiny:-1", "seed '-1'"},
    {"synthetic:tiny:", "seed ''"},
    {"synthetic:tiny:99999999999999999999", "seed '99999999999999999999'"},
    {"synthetic:tiny:1:2:3", "too many ':' fields"},
    {"synthetic:tiny:1:0", "layers '0' is not a whole number"},
    {"synthetic:120b:1:37", "layers '37'"},
    {"synthetic:demo-chain", "the demo model is trained weights"},
    {"synthetic:-chain", "unknown preset '-chain'"},
};

}  // namespace flotilla::testing_util
