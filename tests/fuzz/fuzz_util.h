// Shared helpers of the fuzz targets (tests/fuzz/README.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>
#include <vector>

#include "common/tokenizer/tokenizer.h"

namespace flotilla::fuzz {

// The o200k_harmony tokenizer, loaded once per process from the build tree
// (Tokenizer::DefaultRanksPath()). A missing ranks file aborts the run: a
// fuzz target that cannot load its tokenizer tests nothing.
inline const tokenizer::Tokenizer& SharedTokenizer() {
  static const tokenizer::Tokenizer* tok = [] {
    auto t = tokenizer::Tokenizer::Create(tokenizer::Tokenizer::DefaultRanksPath());
    if (!t.ok()) {
      std::fprintf(stderr, "fuzz: cannot load the tokenizer: %s\n",
                   std::string(t.status().message()).c_str());
      std::abort();
    }
    return t->release();
  }();
  return *tok;
}

// A property the code under test must keep; a violation is a finding.
#define FLOTILLA_FUZZ_CHECK(cond)                                                             \
  do {                                                                                        \
    if (!(cond)) {                                                                            \
      std::fprintf(stderr, "%s:%d: fuzz property violated: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                           \
    }                                                                                         \
  } while (0)

// Reads the input as little-endian 32-bit token ids (a trailing partial word is
// dropped). Ids are taken modulo `modulus` when it is non-zero, so most of
// them land in (or just past) the vocabulary.
inline std::vector<tokenizer::TokenId> TokenIds(const uint8_t* data, size_t size,
                                                uint32_t modulus) {
  std::vector<tokenizer::TokenId> ids;
  ids.reserve(size / 4);
  for (size_t i = 0; i + 4 <= size; i += 4) {
    uint32_t v = uint32_t{data[i]} | uint32_t{data[i + 1]} << 8 | uint32_t{data[i + 2]} << 16 |
                 uint32_t{data[i + 3]} << 24;
    ids.push_back(modulus == 0 ? v : v % modulus);
  }
  return ids;
}

}  // namespace flotilla::fuzz
