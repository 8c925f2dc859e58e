#include "worker/constraint_filter.h"

#include <mutex>

#include "absl/strings/str_cat.h"

#include "common/grammar/constraint_proto.h"
#include "common/grammar/o200k_vocabulary.h"

namespace flotilla::worker {

VocabularyProvider LazyO200kVocabulary(int vocab_size) {
  struct Loaded {
    std::once_flag once;
    absl::StatusOr<std::shared_ptr<const grammar::VocabularyIndex>> index =
        absl::UnknownError("not loaded");
  };
  auto loaded = std::make_shared<Loaded>();
  return [loaded, vocab_size]() {
    std::call_once(loaded->once, [&] { loaded->index = grammar::LoadO200kIndex(vocab_size); });
    return loaded->index;
  };
}

absl::StatusOr<std::unique_ptr<ConstraintFilter>> ConstraintFilter::Create(
    const cluster::OutputConstraint& proto, const VocabularyProvider& vocabulary) {
  absl::StatusOr<std::shared_ptr<const grammar::VocabularyIndex>> index = vocabulary();
  if (!index.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("structured outputs need the tokenizer: ", index.status().message()));
  }
  absl::StatusOr<std::unique_ptr<grammar::OutputConstraint>> c =
      grammar::OutputConstraint::Create(grammar::FromProto(proto), *index);
  if (!c.ok()) return c.status();
  std::unique_ptr<ConstraintFilter> f(new ConstraintFilter(*std::move(c)));
  f->words_ = (*index)->words();
  return f;
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
