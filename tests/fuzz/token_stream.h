// The byte encoding of token streams shared by the Harmony parser target and
// its seed generator (tests/fuzz/README.md): a stream of byte-level tokens,
// Harmony special tokens and arbitrary ids, compact enough that mutations
// reach the parser's structure (headers, channels, recipients) quickly.
//   byte < 16          an entry of kSpecialCodes (specials and edge-case ids)
//   16 <= byte < 0xF0  the single-byte token of that byte (ASCII text, and
//                      0x80..0xEF: pieces of UTF-8 characters)
//   0xF0 + 3 bytes     any id: the 24-bit little-endian value modulo
//                      kVocabSize + 16 (some ids are outside the vocabulary)
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/tokenizer/tokenizer.h"

namespace flotilla::fuzz {

inline constexpr std::array<tokenizer::TokenId, 16> kSpecialCodes = {
    tokenizer::kStart,
    tokenizer::kEnd,
    tokenizer::kMessage,
    tokenizer::kChannel,
    tokenizer::kConstrain,
    tokenizer::kReturn,
    tokenizer::kCall,
    tokenizer::kEndOfText,
    tokenizer::kStartOfText,
    200000,
    tokenizer::kVocabSize - 1,
    tokenizer::kVocabSize,
    0xFFFFFFFFu,
    tokenizer::kFirstSpecialId - 1,
    0,
    tokenizer::kVocabSize + 1000,
};

// The single-byte token of every byte (the byte-level BPE has one per byte).
inline const std::array<tokenizer::TokenId, 256>& ByteTokens(const tokenizer::Tokenizer& tok) {
  static const std::array<tokenizer::TokenId, 256> table = [&tok] {
    std::array<tokenizer::TokenId, 256> t{};
    t.fill(tokenizer::kVocabSize);
    for (tokenizer::TokenId id = 0; id < tokenizer::kFirstSpecialId; ++id) {
      absl::StatusOr<std::string_view> b = tok.TokenBytes(id);
      if (b.ok() && b->size() == 1) t[static_cast<uint8_t>((*b)[0])] = id;
    }
    return t;
  }();
  return table;
}

inline std::vector<tokenizer::TokenId> DecodeTokenStream(const tokenizer::Tokenizer& tok,
                                                         const uint8_t* data, size_t size) {
  const auto& bytes = ByteTokens(tok);
  std::vector<tokenizer::TokenId> ids;
  for (size_t i = 0; i < size; ++i) {
    const uint8_t b = data[i];
    if (b < 16) {
      ids.push_back(kSpecialCodes[b]);
    } else if (b < 0xF0) {
      ids.push_back(bytes[b]);
    } else if (i + 3 < size) {
      const uint32_t v =
          uint32_t{data[i + 1]} | uint32_t{data[i + 2]} << 8 | uint32_t{data[i + 3]} << 16;
      ids.push_back(v % (tokenizer::kVocabSize + 16));
      i += 3;
    } else {
      break;
    }
  }
  return ids;
}

}  // namespace flotilla::fuzz
