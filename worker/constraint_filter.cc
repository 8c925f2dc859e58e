#include "worker/constraint_filter.h"

#include <algorithm>
#include <mutex>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "common/grammar/constraint_proto.h"

namespace flotilla::worker {

VocabularyProvider LazyO200kVocabulary(int vocab_size) {
  struct Loaded {
    std::once_flag once;
    absl::StatusOr<ConstraintVocabulary> vocabulary = absl::UnknownError("not loaded");
  };
  auto loaded = std::make_shared<Loaded>();
  return [loaded, vocab_size]() {
    std::call_once(loaded->once, [&] { loaded->vocabulary = grammar::LoadO200k(vocab_size); });
    return loaded->vocabulary;
  };
}

absl::StatusOr<std::unique_ptr<ConstraintFilter>> ConstraintFilter::Create(
    const cluster::OutputConstraint& proto, const VocabularyProvider& vocabulary) {
  absl::StatusOr<ConstraintVocabulary> v = vocabulary();
  if (!v.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("structured outputs need the tokenizer: ", v.status().message()));
  }
  absl::StatusOr<std::unique_ptr<grammar::OutputConstraint>> c =
      grammar::OutputConstraint::Create(grammar::FromProto(proto), v->index);
  if (!c.ok()) return c.status();
  std::unique_ptr<ConstraintFilter> f(new ConstraintFilter(*std::move(c), v->tokenizer));
  f->words_ = v->index->words();
  return f;
}

std::vector<int32_t> ConstraintFilter::ForcedDraft(int64_t limit) const {
  std::vector<int32_t> draft;
  if (limit <= 0 || tokenizer_ == nullptr || !status_.ok() || c_->complete()) return draft;
  // A token holds at least one byte: `limit` tokens need at most `limit`
  // symbols, but a token is often several, so look a little further.
  const int symbols = static_cast<int>(std::min<int64_t>(64, 4 * limit));
  std::vector<tokenizer::TokenId> ids;
  for (const grammar::ForcedPiece& piece : c_->Forced(symbols)) {
    if (piece.special >= 0) {
      draft.push_back(piece.special);
      continue;
    }
    const size_t valid = tokenizer::ValidUtf8Prefix(piece.bytes);
    ids.clear();
    tokenizer_->EncodeOrdinaryInto(std::string_view(piece.bytes).substr(0, valid), ids);
    draft.insert(draft.end(), ids.begin(), ids.end());
    if (valid < piece.bytes.size()) break;  // the rest of the character is not forced
  }
  draft.resize(std::min(draft.size(), c_->AcceptedPrefix(draft)));
  if (static_cast<int64_t>(draft.size()) > limit) draft.resize(static_cast<size_t>(limit));
  return draft;
}

const uint32_t* ConstraintFilter::Allowed() {
  if (!status_.ok()) return nullptr;
  const uint32_t* mask = c_->Mask();
  if (mask == nullptr) return nullptr;
  bool any = false;
  for (int w = 0; w < words_ && !any; ++w) any = mask[w] != 0;
  if (!any) {
    status_ = absl::InternalError("structured output: no token of the vocabulary can continue");
  }
  return mask;
}

void ConstraintFilter::Accept(int32_t token) {
  if (!status_.ok() || c_->complete()) return;
  status_ = c_->Advance(token);
}

}  // namespace flotilla::worker
