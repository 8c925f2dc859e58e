// The o200k_harmony vocabulary as a constraint sees it: the bytes of every
// ordinary token below `vocab_size` and the Harmony special tokens' ids.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "common/grammar/vocabulary_index.h"
#include "common/tokenizer/tokenizer.h"

namespace flotilla::grammar {

// `vocab_size`: the model's (ids at or above it are never allowed).
TokenVocabulary O200kVocabulary(const tokenizer::Tokenizer& tokenizer, int vocab_size);

// The tokenizer, loaded from its default ranks file, and its index.
struct O200k {
  std::shared_ptr<const tokenizer::Tokenizer> tokenizer;
  std::shared_ptr<const VocabularyIndex> index;
};
absl::StatusOr<O200k> LoadO200k(int vocab_size);

// LoadO200k's index alone.
absl::StatusOr<std::shared_ptr<const VocabularyIndex>> LoadO200kIndex(int vocab_size);

}  // namespace flotilla::grammar
