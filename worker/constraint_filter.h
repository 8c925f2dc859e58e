// A request's structured-output constraint as its sampler's TokenFilter:
// the mask of the Harmony turn constraint, advanced by every token drawn. A
// token outside the mask (which a correct sampler never draws) or a turn no
// token can continue leaves an error the scheduler ends the request with.
#pragma once

#include <functional>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/grammar/output_constraint.h"
#include "proto/cluster.pb.h"
#include "worker/engine/sampler.h"

namespace flotilla::worker {

// Gives the vocabulary index constraints are built over (loaded once).
using VocabularyProvider =
    std::function<absl::StatusOr<std::shared_ptr<const grammar::VocabularyIndex>>()>;

// The o200k vocabulary of `vocab_size` tokens, loaded at the first call.
VocabularyProvider LazyO200kVocabulary(int vocab_size);

class ConstraintFilter : public TokenFilter {
 public:
  static absl::StatusOr<std::unique_ptr<ConstraintFilter>> Create(
      const cluster::OutputConstraint& proto, const VocabularyProvider& vocabulary);

  const uint32_t* Allowed() override;
  void Accept(int32_t token) override;
  // OK while every token drawn was allowed and the turn can continue.
  const absl::Status& status() const { return status_; }

 private:
  explicit ConstraintFilter(std::unique_ptr<grammar::OutputConstraint> c) : c_(std::move(c)) {}
  std::unique_ptr<grammar::OutputConstraint> c_;
  absl::Status status_;
  int words_ = 0;
};

}  // namespace flotilla::worker
