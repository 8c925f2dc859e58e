#include "common/grammar/o200k_vocabulary.h"

#include <algorithm>

namespace flotilla::grammar {

TokenVocabulary O200kVocabulary(const tokenizer::Tokenizer& tokenizer, int vocab_size) {
  TokenVocabulary v;
  v.vocab_size = vocab_size;
  v.bytes.resize(vocab_size);
  const int ordinary = std::min<int>(vocab_size, tokenizer::kFirstSpecialId);
  for (int t = 0; t < ordinary; ++t) {
    absl::StatusOr<std::string_view> bytes = tokenizer.TokenBytes(static_cast<tokenizer::TokenId>(t));
    if (bytes.ok()) v.bytes[t] = std::string(*bytes);
  }
  auto special = [&](tokenizer::TokenId id) {
    return static_cast<int32_t>(id) < vocab_size ? static_cast<int32_t>(id) : -1;
  };
  v.channel = special(tokenizer::kChannel);
  v.message = special(tokenizer::kMessage);
  v.end = special(tokenizer::kEnd);
  v.start = special(tokenizer::kStart);
  v.return_ = special(tokenizer::kReturn);
  v.constrain = special(tokenizer::kConstrain);
  v.call = special(tokenizer::kCall);
  return v;
}

absl::StatusOr<O200k> LoadO200k(int vocab_size) {
  absl::StatusOr<std::unique_ptr<tokenizer::Tokenizer>> tok =
      tokenizer::Tokenizer::Create(tokenizer::Tokenizer::DefaultRanksPath());
  if (!tok.ok()) return tok.status();
  O200k o;
  o.tokenizer = *std::move(tok);
  o.index = std::make_shared<const VocabularyIndex>(O200kVocabulary(*o.tokenizer, vocab_size));
  return o;
}

absl::StatusOr<std::shared_ptr<const VocabularyIndex>> LoadO200kIndex(int vocab_size) {
  absl::StatusOr<O200k> o = LoadO200k(vocab_size);
  if (!o.ok()) return o.status();
  return o->index;
}

}  // namespace flotilla::grammar
