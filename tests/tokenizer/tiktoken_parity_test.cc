// Our o200k encoding must equal tiktoken's, id for id, on a 24,000-string
// corpus (scripts and languages, emoji and ZWJ sequences, combining marks,
// code, whitespace runs, digits, contractions, special-token-like text).
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "common/tokenizer/tokenizer.h"

namespace flotilla::tokenizer {
namespace {

class TiktokenParity : public ::testing::TestWithParam<Tokenizer::Splitter> {};

TEST_P(TiktokenParity, CorpusEncodesExactlyLikeTiktoken) {
  // One reference file per splitter: ctest may run both at once.
  const std::string out = std::string(FLOTILLA_REFERENCE_OUT) +
                          (GetParam() == Tokenizer::Splitter::kScanner ? ".scanner" : ".pcre2");
  const std::string cmd = std::string("\"") + FLOTILLA_NODE + "\" \"" + FLOTILLA_REFERENCE_SCRIPT + "\" \"" +
                          FLOTILLA_NODE_MODULES + "\" \"" + out + "\" 24000";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << "reference generation failed: " << cmd
                                         << " (node and tools/setup.sh's npm packages are required)";
  auto tok = Tokenizer::Create(Tokenizer::DefaultRanksPath(), GetParam());
  ASSERT_TRUE(tok.ok()) << tok.status();

  std::ifstream in(out);
  ASSERT_TRUE(in) << out;
  std::string line;
  size_t n = 0, mismatches = 0, bytes = 0;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    const std::string text = j["text"].get<std::string>();
    const std::vector<TokenId> want = j["ids"].get<std::vector<TokenId>>();
    auto got = (*tok)->EncodeOrdinary(text);
    ++n;
    bytes += text.size();
    ASSERT_TRUE(got.ok()) << got.status();
    if (*got != want && ++mismatches <= 10) {
      ADD_FAILURE() << "mismatch on " << nlohmann::json(text).dump() << "\n  want "
                    << nlohmann::json(want).dump() << "\n  got  " << nlohmann::json(*got).dump();
    }
    // Decoding round-trips.
    auto back = (*tok)->DecodeUtf8(*got);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, text);
  }
  EXPECT_EQ(n, 24000u);
  EXPECT_EQ(mismatches, 0u) << "of " << n << " strings (" << bytes << " bytes)";
}

INSTANTIATE_TEST_SUITE_P(Splitters, TiktokenParity,
                         ::testing::Values(Tokenizer::Splitter::kScanner, Tokenizer::Splitter::kPcre2),
                         [](const ::testing::TestParamInfo<Tokenizer::Splitter>& info) {
                           return info.param == Tokenizer::Splitter::kScanner ? "Scanner" : "Pcre2";
                         });

}  // namespace
}  // namespace flotilla::tokenizer
