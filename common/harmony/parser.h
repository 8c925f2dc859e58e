// A streaming parser of Harmony completions, fed one token at a time.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/harmony/message.h"
#include "common/tokenizer/streaming_detokenizer.h"
#include "common/tokenizer/tokenizer.h"

namespace flotilla::harmony {

struct ParserOptions {
  // The role of the first message when the prompt already ended with
  // `<|start|>ROLE` (rendering for completion does): the stream then begins
  // inside that message's header. Unset: the stream begins with `<|start|>`.
  std::optional<Role> start_role;
  // Strict: any malformed structure is an error. Non-strict: a malformed header
  // or a stray token is recorded in warnings() and parsing goes on (a header the
  // parser cannot read becomes an assistant message with whatever channel and
  // recipient it could find), and bytes that are not UTF-8 become U+FFFD.
  bool strict = true;
};

class StreamParser {
 public:
  enum class State { kExpectStart, kHeader, kContent };
  // What the last token did.
  enum class Event {
    kNone,            // ignored (non-strict) or between messages
    kHeaderProgress,  // part of a header
    kMessageStarted,  // `<|message|>`: the header is known (current())
    kContentDelta,    // content; last_content_delta() holds the new text (may be
                      // empty while a UTF-8 character is incomplete)
    kMessageEnded,    // `<|end|>`, `<|return|>` or `<|call|>`: see messages().back()
  };

  // `tokenizer` must outlive the parser.
  StreamParser(const tokenizer::Tokenizer* tokenizer, ParserOptions options);

  // Feeds one token. Errors name the token and what was wrong; an id outside
  // the vocabulary is an error in either mode. After an error the parser should
  // be discarded.
  absl::StatusOr<Event> Process(tokenizer::TokenId token);
  // Ends the stream: a message still in its content is completed; a stream that
  // stops inside a header is an error (strict) or recovered (non-strict).
  absl::Status Finish();

  State state() const { return state_; }
  // The message being read: role/name/channel/recipient/content_type once its
  // header is complete (state kContent), and the content so far.
  const Message& current() const { return current_; }
  const std::string& last_content_delta() const { return delta_; }
  // Completed messages, in order.
  const std::vector<Message>& messages() const { return messages_; }
  // The token that ended messages()[i]; nullopt when the stream ran out first.
  const std::vector<std::optional<tokenizer::TokenId>>& end_tokens() const { return end_tokens_; }
  const std::vector<std::string>& warnings() const { return warnings_; }

 private:
  absl::Status BeginContent();
  absl::Status EndMessage(std::optional<tokenizer::TokenId> end_token);
  absl::Status RecoverHeader(const std::string& why, bool header_is_content);
  std::string HeaderText() const;
  absl::Status Fail(const std::string& what, tokenizer::TokenId token);

  const tokenizer::Tokenizer* tok_;
  ParserOptions options_;
  State state_;
  std::optional<Role> header_role_;  // preset role of the message being read
  std::vector<tokenizer::TokenId> header_tokens_;
  Message current_;
  tokenizer::StreamingDetokenizer detok_;
  std::string delta_;
  size_t position_ = 0;  // tokens consumed, for error messages
  std::vector<Message> messages_;
  std::vector<std::optional<tokenizer::TokenId>> end_tokens_;
  std::vector<std::string> warnings_;
};

// The parts of a Harmony header ("assistant to=functions.f<|channel|>commentary
// <|constrain|>json"); `preset_role` is the role when the header omits it.
// The recipient may come before or after the channel.
absl::StatusOr<Message> ParseHeader(const std::string& header, std::optional<Role> preset_role);

// Parses a whole completion.
absl::StatusOr<std::vector<Message>> ParseCompletion(const tokenizer::Tokenizer& tok,
                                                     const std::vector<tokenizer::TokenId>& tokens,
                                                     const ParserOptions& options);

}  // namespace flotilla::harmony
