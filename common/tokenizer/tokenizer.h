// o200k_harmony: the byte-level BPE tokenizer of gpt-oss.
//
// o200k_base merge ranks (ids 0..199997, loaded from the compact ranks file that
// tools/tokenizer/export_ranks.js writes), the o200k pre-tokenisation pattern
// (a hand-written scanner by default, PCRE2 with JIT on request; both use the
// reference implementation's Unicode tables from the same file), and the
// Harmony special tokens: <|startoftext|> 199998,
// <|endoftext|> 199999, <|return|> 200002, <|constrain|> 200003, <|channel|>
// 200005, <|start|> 200006, <|end|> 200007, <|message|> 200008, <|call|> 200012,
// and <|reserved_N|> for every other id N in 200000..201087.
//
// A Tokenizer is immutable after Create() and safe to share between threads.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace flotilla::tokenizer {

using TokenId = uint32_t;

// Ids of the Harmony special tokens.
inline constexpr TokenId kStartOfText = 199998;
inline constexpr TokenId kEndOfText = 199999;
inline constexpr TokenId kReturn = 200002;
inline constexpr TokenId kConstrain = 200003;
inline constexpr TokenId kChannel = 200005;
inline constexpr TokenId kStart = 200006;
inline constexpr TokenId kEnd = 200007;
inline constexpr TokenId kMessage = 200008;
inline constexpr TokenId kCall = 200012;
// First id after the ordinary (merge-rank) tokens, and the vocabulary size.
inline constexpr TokenId kFirstSpecialId = 199998;
inline constexpr TokenId kVocabSize = 201088;

// Which special tokens Encode() turns into their ids when they appear in text.
struct SpecialTokenPolicy {
  enum class Allowed { kNone, kAll, kListed };
  Allowed allowed = Allowed::kNone;
  // Names such as "<|start|>" when allowed == kListed.
  absl::flat_hash_set<std::string> listed;
  // When true (tiktoken's default), text containing a special token that is not
  // allowed is an error; when false such text is encoded as ordinary text.
  bool disallowed_is_error = true;

  static SpecialTokenPolicy None() { return {}; }
  static SpecialTokenPolicy All() { return {Allowed::kAll, {}, true}; }
  // Special-token-like text is plain text (tiktoken's encode_ordinary).
  static SpecialTokenPolicy Ordinary() { return {Allowed::kNone, {}, false}; }
};

class Tokenizer {
 public:
  // How text is split into pieces before BPE. Both split exactly as tiktoken's
  // o200k pattern does (the parity test checks each); the scanner is faster.
  enum class Splitter {
    kScanner,  // hand-written matcher of the o200k pattern over a code point class table
    kPcre2,    // the o200k pattern compiled by PCRE2 (JIT)
  };

  // Loads the ranks file written by tools/tokenizer/export_ranks.js.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> Create(const std::string& ranks_path,
                                                           Splitter splitter = Splitter::kScanner);

  // The default ranks file: `o200k_base.ranks` beside the running executable,
  // else the first `share/flotilla/o200k_base.ranks` found in the executable's
  // directory or one of its four nearest ancestors (the build tree puts it in
  // <build>/share/flotilla/; an install puts binaries in <prefix>/bin/ and the
  // file in <prefix>/share/flotilla/). Returns the best candidate even when it
  // does not exist, so that the error names a path.
  static std::string DefaultRanksPath();

  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Encodes UTF-8 text. Fails on invalid UTF-8 (naming the byte offset) and on a
  // special token the policy does not allow (when disallowed_is_error).
  absl::StatusOr<std::vector<TokenId>> Encode(std::string_view text,
                                              const SpecialTokenPolicy& policy) const;
  // Encodes text with every special-token-like substring treated as text.
  absl::StatusOr<std::vector<TokenId>> EncodeOrdinary(std::string_view text) const {
    return Encode(text, SpecialTokenPolicy::Ordinary());
  }
  // Appends the ordinary encoding of `text` (valid UTF-8, already checked) to `out`.
  void EncodeOrdinaryInto(std::string_view text, std::vector<TokenId>& out) const;

  // The bytes of the tokens concatenated (special tokens as their names).
  // Fails on an id outside the vocabulary.
  absl::StatusOr<std::string> DecodeBytes(const std::vector<TokenId>& ids) const;
  // As DecodeBytes, but the result must be valid UTF-8 (error names the offset).
  absl::StatusOr<std::string> DecodeUtf8(const std::vector<TokenId>& ids) const;
  // The bytes of one token; fails on an id outside the vocabulary.
  absl::StatusOr<std::string_view> TokenBytes(TokenId id) const;

  // The id of a special token by name ("<|start|>"), if it is one.
  std::optional<TokenId> SpecialTokenId(std::string_view name) const;
  static bool IsSpecial(TokenId id) { return id >= kFirstSpecialId && id < kVocabSize; }
  static bool IsValid(TokenId id) { return id < kVocabSize; }
  TokenId vocab_size() const { return kVocabSize; }

 private:
  struct Regex;
  Tokenizer() = default;
  absl::Status Init(const std::string& ranks_path, Splitter splitter);
  // End of the o200k pattern's match at `pos` of valid UTF-8 `text` (the scanner).
  size_t ScanPiece(std::string_view text, size_t pos) const;
  void SplitWithScanner(std::string_view text, std::vector<TokenId>& out) const;
  void SplitWithPcre2(std::string_view text, std::vector<TokenId>& out) const;
  // BPE of one pre-tokenised piece.
  void EncodePiece(std::string_view piece, std::vector<TokenId>& out) const;
  std::optional<TokenId> Rank(std::string_view bytes) const;

  std::string blob_;                 // token bytes, rank order
  std::vector<uint32_t> offsets_;    // num_ranks + 1 offsets into blob_
  absl::flat_hash_map<std::string_view, TokenId> ranks_;  // views into blob_
  std::vector<std::string> special_names_;                // id - kFirstSpecialId -> name
  absl::flat_hash_map<std::string, TokenId> special_ids_;
  Splitter splitter_ = Splitter::kScanner;
  std::unique_ptr<Regex> regex_;         // kPcre2
  std::vector<uint8_t> char_class_;      // kScanner: code point -> class bits
};

// Returns the length of the longest prefix of `bytes` that is valid UTF-8. When
// `invalid` is not null it is set to true if the bytes after that prefix can
// never become valid (a bad byte), false if they are only an incomplete
// sequence at the end that more bytes could complete (or there are none).
size_t ValidUtf8Prefix(std::string_view bytes, bool* invalid = nullptr);
// OK when `bytes` is entirely valid UTF-8, else InvalidArgument naming `what`
// and the offset of the first bad byte.
absl::Status CheckUtf8(std::string_view bytes, std::string_view what);

}  // namespace flotilla::tokenizer
