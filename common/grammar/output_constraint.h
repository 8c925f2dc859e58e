// Grammar-constrained decoding of one assistant turn in Harmony: which tokens
// may come next, given the tokens generated so far. The turn is generated
// after the prompt's `<|start|>assistant`, so the constraint first holds the
// message header to the forms it allows, then each message's body:
//
//   analysis   <|channel|>analysis<|message|> free text <|end|>, then
//              <|start|>assistant and another header (reasoning stays free;
//              once `reasoning_budget` tokens of it were generated only
//              <|end|> may follow, so that the answer still fits)
//   final      <|channel|>final<|message|> JSON of the response schema, then
//              <|return|> as soon as the JSON is complete (free text and
//              <|return|> when no response format is set)
//   tool call  <|channel|>commentary to=functions.NAME<|constrain|>json<|message|>
//              JSON of the tool's parameter schema, then <|call|> (free text
//              for a tool that is not constrained)
//
// `tool_required` drops the final form (tool_choice "required" or a named
// function). Forced() reads, without changing the state, the text the
// grammar leaves no choice about from here (JSON punctuation, a required
// key, a header with one form left, the end token after a whole document):
// the worker drafts it as tokens for the model to verify (speculative
// decoding), so those tokens cost one step instead of one step each.
// Masks are cached per state (the same state recurs at every
// step inside a string, for instance) in a MaskCache that every constraint
// over the same vocabulary shares, so a schema's states cost their trie walk
// once per process, not once per request.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/grammar/json_matcher.h"
#include "common/grammar/mask_cache.h"
#include "common/grammar/schema.h"
#include "common/grammar/vocabulary_index.h"

namespace flotilla::grammar {

// A piece of a forced continuation: ordinary bytes, or one special token.
struct ForcedPiece {
  std::string bytes;     // empty for a special token
  int32_t special = -1;  // a Harmony special token's id, or -1 for bytes
};

struct ConstraintSpec {
  bool json_final = false;       // the final message is JSON
  std::string final_schema;      // its JSON Schema; empty: any JSON object
  struct Tool {
    std::string name;
    std::string schema;          // the parameters' JSON Schema; empty: any object
    bool constrained = true;     // false: free arguments
  };
  std::vector<Tool> tools;       // the tool-call forms allowed (at most 60)
  bool tool_required = false;    // no final message: the turn must call a tool
  int64_t reasoning_budget = 0;  // analysis tokens before <|end|> is forced; 0: no analysis
};

// Compiles every schema of the spec: INVALID_ARGUMENT naming what is
// unsupported (the coordinator calls it to refuse a request early).
absl::Status CheckSpec(const ConstraintSpec& spec);

class OutputConstraint {
 public:
  static absl::StatusOr<std::unique_ptr<OutputConstraint>> Create(
      const ConstraintSpec& spec, std::shared_ptr<const VocabularyIndex> index);

  // The tokens allowed next, MaskWords(vocab_size) words; null once the
  // turn is complete (nothing more is allowed; the end token stopped it).
  const uint32_t* Mask();
  // Takes the token generated; an error when the mask did not allow it.
  absl::Status Advance(int32_t token);
  bool complete() const { return at_.phase == Phase::kDone; }

  // The longest continuation the grammar forces from the current state, at
  // most `max_symbols` bytes and special tokens: at each point exactly one
  // byte or special token is allowed and the turn cannot end there (free
  // text, a choice between forms, or an optional end stop it). Consecutive
  // bytes form one piece; a special token is a piece of its own. Empty once
  // the turn is complete. The state is not changed.
  std::vector<ForcedPiece> Forced(int max_symbols = 64) const;
  // How many of `tokens`, from the first, the constraint would take one
  // after the other from the current state (each one allowed by the mask
  // after the ones before). The state is not changed.
  size_t AcceptedPrefix(const std::vector<int32_t>& tokens) const;

 private:
  enum class Body { kFree, kJson };
  struct Form {                    // one header form and the body it opens
    std::vector<int32_t> symbols;  // bytes 0..255; special tokens as kSpecial + id
    Body body = Body::kFree;
    int32_t end_token = -1;
    int schema = -1;               // index into schemas_ (kJson)
    bool analysis = false;
    std::string cache_id;          // kJson: what its masks depend on but the state
  };
  struct HeaderState {
    uint64_t alive = 0;  // forms still matching
    int pos = 0;         // symbols matched
  };
  enum class Phase { kHeader, kBody, kDone };
  // Where the turn is: what Advance moves and Forced / AcceptedPrefix copy.
  struct Cursor {
    Phase phase = Phase::kHeader;
    HeaderState header;
    int form = -1;  // the body's form
    MatchState json;
    int64_t reasoning_used = 0;
  };
  static constexpr int32_t kSpecial = 1 << 20;

  OutputConstraint(std::shared_ptr<const VocabularyIndex> index) : index_(std::move(index)) {}
  absl::Status Build(const ConstraintSpec& spec);
  // A header of the first set or of the set after an analysis message,
  // its forms chosen by the reasoning left.
  void StartHeader(Cursor& c, bool after_message) const;
  bool FeedHeader(HeaderState& h, int32_t symbol) const;
  void HeaderMask(uint32_t* bits);
  void BodyMask(uint32_t* bits);
  // Takes `token` at `c` when the constraint allows it there (what the
  // mask says, found by feeding); false (`c` unspecified) otherwise.
  bool Take(Cursor& c, int32_t token) const;
  bool TakeHeader(Cursor& c, int32_t token) const;
  bool TakeBody(Cursor& c, int32_t token) const;
  // The one symbol (a byte, or kSpecial + id) allowed at `c`; -1 when none,
  // several, or the turn may also end there.
  int32_t OnlyNext(const Cursor& c) const;
  int32_t OnlyNextJson(const Cursor& c) const;
  void OpenBody(Cursor& c, int form) const;

  std::shared_ptr<const VocabularyIndex> index_;
  std::vector<std::unique_ptr<CompiledSchema>> schemas_;
  std::vector<std::unique_ptr<JsonMatcher>> matchers_;
  std::vector<Form> forms_;
  int64_t reasoning_budget_ = 0;
  Cursor at_;
  std::vector<uint32_t> mask_;
  bool mask_fresh_ = false;
  std::shared_ptr<MaskCache> cache_;
  std::string header_cache_id_;  // what header masks depend on but the state
  std::vector<MatchState> json_scratch_;
  std::vector<HeaderState> header_scratch_;
};

}  // namespace flotilla::grammar
