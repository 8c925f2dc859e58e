// A request's structured-output constraint as its sampler's TokenFilter:
// the mask of the Harmony turn constraint, advanced by every token drawn. A
// token outside the mask (which a correct sampler never draws) or a turn no
// token can continue leaves an error the scheduler ends the request with.
// ForcedDraft turns the text the grammar forces next into tokens the
// scheduler drafts (worker/README.md, "Speculative decoding").
#pragma once

#include <functional>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/grammar/o200k_vocabulary.h"
#include "common/grammar/output_constraint.h"
#include "common/tokenizer/tokenizer.h"
#include "proto/cluster.pb.h"
#include "worker/engine/sampler.h"

namespace flotilla::worker {

// What constraints are built over: the vocabulary index, and the tokenizer
// that encodes forced text into draft tokens (null: no forced drafts).
using ConstraintVocabulary = grammar::O200k;

// Gives the vocabulary constraints are built over (loaded once).
using VocabularyProvider = std::function<absl::StatusOr<ConstraintVocabulary>()>;

// The o200k vocabulary of `vocab_size` tokens and its tokenizer, loaded at
// the first call.
VocabularyProvider LazyO200kVocabulary(int vocab_size);

class ConstraintFilter : public TokenFilter {
 public:
  static absl::StatusOr<std::unique_ptr<ConstraintFilter>> Create(
      const cluster::OutputConstraint& proto, const VocabularyProvider& vocabulary);

  const uint32_t* Allowed() override;
  void Accept(int32_t token) override;
  // OK while every token drawn was allowed and the turn can continue.
  const absl::Status& status() const { return status_; }

  // The tokens of the continuation the grammar forces from here
  // (OutputConstraint::Forced), at most `limit`: each run of forced bytes
  // encoded canonically by the tokenizer (a run cut inside a character
  // ends the draft before it), special tokens as their ids, and only the
  // first tokens the constraint takes one after the other. Empty when
  // nothing is forced, the filter failed or there is no tokenizer. The
  // filter's state is not changed.
  std::vector<int32_t> ForcedDraft(int64_t limit) const;

 private:
  ConstraintFilter(std::unique_ptr<grammar::OutputConstraint> c,
                   std::shared_ptr<const tokenizer::Tokenizer> tokenizer)
      : c_(std::move(c)), tokenizer_(std::move(tokenizer)) {}
  std::unique_ptr<grammar::OutputConstraint> c_;
  std::shared_ptr<const tokenizer::Tokenizer> tokenizer_;
  absl::Status status_;
  int words_ = 0;
};

}  // namespace flotilla::worker
