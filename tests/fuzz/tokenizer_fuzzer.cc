// Fuzz target: the o200k_harmony tokenizer. Input: one mode byte, then the
// payload.
//   mode 0-3: the payload is text, encoded under a special-token policy
//             (0 all, 1 none, 2 ordinary, 3 <|start|> and <|end|> listed,
//             others as text); an accepted text decodes back to itself.
//             Ordinary encoding must give the same ids with the PCRE2 splitter.
//   mode 4-7: the payload is token ids (4 bytes each, little-endian, modulo
//             the vocabulary size + 16): decode, stream-decode (both modes of
//             StreamingDetokenizer) and re-encode the decoded text.
// Properties: nothing crashes; Encode fails exactly on invalid UTF-8 or a
// refused special token; decoding fails exactly on an id outside the
// vocabulary; streaming decoding agrees with whole decoding.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/tokenizer/streaming_detokenizer.h"
#include "common/tokenizer/tokenizer.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

using flotilla::tokenizer::SpecialTokenPolicy;
using flotilla::tokenizer::TokenId;
using flotilla::tokenizer::Tokenizer;

const Tokenizer& Pcre2Tokenizer() {
  static const Tokenizer* tok = [] {
    auto t = Tokenizer::Create(Tokenizer::DefaultRanksPath(), Tokenizer::Splitter::kPcre2);
    FLOTILLA_FUZZ_CHECK(t.ok());
    return t->release();
  }();
  return *tok;
}

void FuzzEncode(const Tokenizer& tok, int mode, std::string_view text) {
  SpecialTokenPolicy policy;
  switch (mode) {
    case 0:
      policy = SpecialTokenPolicy::All();
      break;
    case 1:
      policy = SpecialTokenPolicy::None();
      break;
    case 2:
      policy = SpecialTokenPolicy::Ordinary();
      break;
    default:
      policy.allowed = SpecialTokenPolicy::Allowed::kListed;
      policy.listed = {"<|start|>", "<|end|>"};
      policy.disallowed_is_error = false;
      break;
  }
  const bool utf8 = flotilla::tokenizer::CheckUtf8(text, "text").ok();
  absl::StatusOr<std::vector<TokenId>> ids = tok.Encode(text, policy);
  if (!utf8) {
    FLOTILLA_FUZZ_CHECK(!ids.ok());
    return;
  }
  // Only policy None (special tokens are errors) may refuse valid UTF-8.
  FLOTILLA_FUZZ_CHECK(ids.ok() || mode == 1);
  if (!ids.ok()) return;
  FLOTILLA_FUZZ_CHECK(!text.empty() || ids->empty());
  absl::StatusOr<std::string> back = tok.DecodeUtf8(*ids);
  FLOTILLA_FUZZ_CHECK(back.ok() && *back == text);
  if (mode == 2) {
    absl::StatusOr<std::vector<TokenId>> pcre = Pcre2Tokenizer().EncodeOrdinary(text);
    FLOTILLA_FUZZ_CHECK(pcre.ok() && *pcre == *ids);
  }
}

void FuzzDecode(const Tokenizer& tok, const std::vector<TokenId>& ids) {
  bool all_valid = true;
  for (TokenId id : ids) all_valid = all_valid && Tokenizer::IsValid(id);
  absl::StatusOr<std::string> bytes = tok.DecodeBytes(ids);
  FLOTILLA_FUZZ_CHECK(bytes.ok() == all_valid);
  absl::StatusOr<std::string> utf8 = tok.DecodeUtf8(ids);
  if (utf8.ok()) FLOTILLA_FUZZ_CHECK(bytes.ok() && *utf8 == *bytes);

  using flotilla::tokenizer::StreamingDetokenizer;
  StreamingDetokenizer strict(&tok, StreamingDetokenizer::InvalidBytes::kError);
  StreamingDetokenizer lenient(&tok, StreamingDetokenizer::InvalidBytes::kReplace);
  std::string strict_text, lenient_text;
  bool strict_ok = true;
  for (TokenId id : ids) {
    absl::StatusOr<std::string> a = strict.Append(id);
    if (a.ok()) {
      strict_text += *a;
    } else {
      strict_ok = false;
    }
    absl::StatusOr<std::string> b = lenient.Append(id);
    FLOTILLA_FUZZ_CHECK(b.ok() == Tokenizer::IsValid(id));
    if (b.ok()) lenient_text += *b;
  }
  absl::StatusOr<std::string> strict_end = strict.Finish();
  if (strict_end.ok()) {
    strict_text += *strict_end;
  } else {
    strict_ok = false;
  }
  absl::StatusOr<std::string> lenient_end = lenient.Finish();
  FLOTILLA_FUZZ_CHECK(lenient_end.ok());
  lenient_text += *lenient_end;
  FLOTILLA_FUZZ_CHECK(flotilla::tokenizer::CheckUtf8(lenient_text, "text").ok());
  // The strict stream accepts exactly what whole decoding accepts.
  FLOTILLA_FUZZ_CHECK(strict_ok == utf8.ok());
  if (utf8.ok()) {
    FLOTILLA_FUZZ_CHECK(strict_text == *utf8);
    FLOTILLA_FUZZ_CHECK(lenient_text == *utf8);
    // Re-encoding the text (special tokens allowed) decodes to the same text.
    absl::StatusOr<std::vector<TokenId>> again = tok.Encode(*utf8, SpecialTokenPolicy::All());
    FLOTILLA_FUZZ_CHECK(again.ok());
    absl::StatusOr<std::string> text2 = tok.DecodeUtf8(*again);
    FLOTILLA_FUZZ_CHECK(text2.ok() && *text2 == *utf8);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const Tokenizer& tok = flotilla::fuzz::SharedTokenizer();
  const int mode = data[0] & 7;
  if (mode < 4) {
    FuzzEncode(tok, mode, std::string_view(reinterpret_cast<const char*>(data + 1), size - 1));
  } else {
    FuzzDecode(tok,
               flotilla::fuzz::TokenIds(data + 1, size - 1, flotilla::tokenizer::kVocabSize + 16));
  }
  return 0;
}
