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

// Loads the tokenizer from its default ranks file and indexes it.
absl::StatusOr<std::shared_ptr<const VocabularyIndex>> LoadO200kIndex(int vocab_size);

}  // namespace flotilla::grammar
