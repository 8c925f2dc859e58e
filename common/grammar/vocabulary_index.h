// The ordinary tokens of a vocabulary sorted by their bytes, so that the
// tokens a byte automaton accepts from a state are found in one pass that
// shares the work of common prefixes and skips every token under a rejected
// prefix (a number state looks at a few hundred tokens, not 200k).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace flotilla::grammar {

// Bit t of a mask (words of 32 bits) is set when token t is allowed.
inline void SetBit(uint32_t* bits, int32_t t) { bits[t >> 5] |= 1u << (t & 31); }
inline bool TestBit(const uint32_t* bits, int32_t t) { return (bits[t >> 5] >> (t & 31)) & 1; }
inline int MaskWords(int vocab_size) { return (vocab_size + 31) / 32; }

// What a constraint needs of the tokenizer: each id's bytes (empty for
// special and unused ids) and the Harmony special tokens' ids.
struct TokenVocabulary {
  int vocab_size = 0;
  std::vector<std::string> bytes;  // [vocab_size]
  int32_t channel = -1, message = -1, end = -1, start = -1, return_ = -1, constrain = -1,
          call = -1;
};

class VocabularyIndex {
 public:
  explicit VocabularyIndex(TokenVocabulary vocab);

  const TokenVocabulary& vocab() const { return vocab_; }
  int words() const { return MaskWords(vocab_.vocab_size); }
  // Sets every ordinary token (one with bytes).
  void AllowAllOrdinary(uint32_t* bits) const;

  // Sets bit t for every ordinary token whose bytes `feed(state, byte)`
  // accepts one after the other from `start`. `scratch` holds one State per
  // byte of the longest token (reused between calls).
  template <typename State, typename Feed>
  void AllowAccepted(const State& start, Feed&& feed, std::vector<State>* scratch,
                     uint32_t* bits) const {
    Walk(all_, start, feed, scratch, bits);
  }

  // Plain text: a token whose bytes are printable ASCII but '"' and '\', or
  // whole UTF-8 characters (no surrogate, no overlong form), the text a JSON
  // string holds as it is. Inside a string with no pattern, at a character
  // boundary, such a token is taken exactly when its characters fit.
  //
  // Sets every plain token of at most `max_chars` characters (negative: any).
  void AllowPlainText(int64_t max_chars, uint32_t* bits) const;
  // AllowAccepted over the tokens that are not plain text only.
  template <typename State, typename Feed>
  void AllowAcceptedNotPlain(const State& start, Feed&& feed, std::vector<State>* scratch,
                             uint32_t* bits) const {
    Walk(not_plain_, start, feed, scratch, bits);
  }

 private:
  // Ordinary ids sorted by their bytes, and each one's common prefix with
  // the previous one: the order a walk shares prefixes in.
  struct Sorted {
    std::vector<int32_t> order;
    std::vector<int> lcp;
    // next_first[k]: the first position after k whose token starts with
    // another byte (a walk that refuses a token's first byte skips there).
    std::vector<int> next_first;
  };
  Sorted SortedOf(std::vector<int32_t> ids) const;

  template <typename State, typename Feed>
  void Walk(const Sorted& sorted, const State& start, Feed&& feed, std::vector<State>* scratch,
            uint32_t* bits) const {
    if (scratch->size() < static_cast<size_t>(longest_ + 1)) scratch->resize(longest_ + 1);
    std::vector<State>& states = *scratch;
    Copy(states[0], start);
    int valid = 0;          // states[0..valid] hold the current token's prefixes
    int rejected_at = -1;   // byte index of the last rejection (its prefix is dead)
    for (size_t k = 0; k < sorted.order.size(); ++k) {
      const int lcp = sorted.lcp[k];
      if (rejected_at >= 0 && rejected_at < lcp) continue;  // shares the dead prefix
      rejected_at = -1;
      valid = std::min(valid, lcp);
      const std::string& token = vocab_.bytes[sorted.order[k]];
      const int n = static_cast<int>(token.size());
      for (; valid < n; ++valid) {
        Copy(states[valid + 1], states[valid]);
        if (!feed(states[valid + 1], static_cast<uint8_t>(token[valid]))) {
          rejected_at = valid;
          break;
        }
      }
      if (rejected_at < 0) {
        SetBit(bits, sorted.order[k]);
      } else if (rejected_at == 0) {
        k = sorted.next_first[k] - 1;  // every token with this first byte is refused
        rejected_at = -1;
      }
    }
  }

  template <typename State>
  static void Copy(State& to, const State& from) {
    if constexpr (requires { to.CopyFrom(from); }) {
      to.CopyFrom(from);
    } else {
      to = from;
    }
  }

  TokenVocabulary vocab_;
  Sorted all_;        // every ordinary token
  Sorted not_plain_;  // the ordinary tokens that are not plain text
  // plain_up_to_[c]: the plain tokens of at most c characters (a mask each,
  // c up to the most characters a plain token has; the last holds them all).
  std::vector<std::vector<uint32_t>> plain_up_to_;
  int longest_ = 0;
};

}  // namespace flotilla::grammar
