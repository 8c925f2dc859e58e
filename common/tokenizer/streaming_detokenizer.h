// Turns a stream of token ids into UTF-8 text, holding back the bytes of a
// character that is split across tokens until the rest of it arrives.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "common/tokenizer/tokenizer.h"

namespace flotilla::tokenizer {

class StreamingDetokenizer {
 public:
  enum class InvalidBytes {
    kError,    // a byte sequence that can never be valid UTF-8 is an error
    kReplace,  // ... is replaced by U+FFFD (one per bad byte) and decoding goes on
  };

  // `tokenizer` must outlive this object.
  explicit StreamingDetokenizer(const Tokenizer* tokenizer,
                                InvalidBytes invalid = InvalidBytes::kError)
      : tokenizer_(tokenizer), invalid_(invalid) {}

  // Adds one token; returns the text that is now complete (possibly empty).
  // Fails on an id outside the vocabulary, and in kError mode on bytes that are
  // not UTF-8; after an error the detokenizer keeps its earlier state.
  absl::StatusOr<std::string> Append(TokenId id);
  // Ends the stream. Bytes still held back (an incomplete character) are an
  // error in kError mode and one U+FFFD in kReplace mode.
  absl::StatusOr<std::string> Finish();
  // Bytes held back waiting for the rest of a character.
  size_t pending_bytes() const { return pending_.size(); }

 private:
  const Tokenizer* tokenizer_;
  InvalidBytes invalid_;
  std::string pending_;
};

}  // namespace flotilla::tokenizer
