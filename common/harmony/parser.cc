#include "common/harmony/parser.h"

#include <cctype>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace flotilla::harmony {
namespace {

namespace tk = tokenizer;
constexpr std::string_view kChannelName = "<|channel|>";
constexpr std::string_view kConstrainName = "<|constrain|>";

bool IsSpace(char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; }

std::vector<std::string> SplitWords(const std::string& s) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && IsSpace(s[i])) ++i;
    size_t j = i;
    while (j < s.size() && !IsSpace(s[j])) ++j;
    if (j > i) out.push_back(s.substr(i, j - i));
    i = j;
  }
  return out;
}

// Takes "<|channel|>NAME" out of `header`; NAME runs to whitespace or '<'.
absl::StatusOr<std::string> ExtractChannel(std::string& header) {
  size_t at = header.find(kChannelName);
  if (at == std::string::npos) return std::string();
  size_t begin = at + kChannelName.size();
  size_t end = begin;
  while (end < header.size() && !IsSpace(header[end]) && header[end] != '<') ++end;
  if (end == begin) return absl::InvalidArgumentError("<|channel|> is not followed by a channel name");
  std::string channel = header.substr(begin, end - begin);
  std::string rest;
  rest.reserve(header.size());
  rest.append(header, 0, at);
  rest.push_back(' ');
  rest.append(header, end, std::string::npos);
  header = std::move(rest);
  if (header.find(kChannelName) != std::string::npos) {
    return absl::InvalidArgumentError("the header has more than one <|channel|>");
  }
  return channel;
}

}  // namespace

absl::StatusOr<Message> ParseHeader(const std::string& header_in, std::optional<Role> preset_role) {
  std::string header = header_in;
  Message m;
  auto channel = ExtractChannel(header);
  if (!channel.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("malformed header '", header_in, "': ", channel.status().message()));
  }
  m.channel = *channel;
  // "to=f<|constrain|>json": the constraint is a word of its own.
  for (size_t at = header.find(kConstrainName); at != std::string::npos;
       at = header.find(kConstrainName, at + kConstrainName.size() + 1)) {
    header.insert(header.begin() + static_cast<std::ptrdiff_t>(at), ' ');
  }
  std::vector<std::string> words = SplitWords(header);
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat("malformed header '", header_in, "': ", why));
  };
  size_t i = 0;
  if (preset_role) {
    m.role = *preset_role;
    if (!words.empty() && words[0] == RoleName(*preset_role)) ++i;
  } else {
    if (words.empty()) return bad("it names no role");
    const std::string& first = words[0];
    if (first.rfind("to=", 0) == 0 || first.rfind(kConstrainName, 0) == 0) return bad("it names no role");
    auto role = ParseRole(first);
    if (role.ok()) {
      m.role = *role;
    } else if (first.find('.') != std::string::npos || words.size() > 1) {
      // A tool's result: the author is the tool, e.g. "functions.get_weather".
      m.role = Role::kTool;
      m.name = first;
    } else {
      return bad(std::string(role.status().message()));
    }
    ++i;
  }
  for (; i < words.size(); ++i) {
    const std::string& w = words[i];
    if (w.rfind("to=", 0) == 0) {
      if (!m.recipient.empty()) return bad("it has two recipients");
      m.recipient = w.substr(3);
      if (m.recipient.empty()) return bad("'to=' names no recipient");
    } else if (w.find("<|") != std::string::npos && w.rfind(kConstrainName, 0) != 0) {
      return bad(absl::StrCat("unexpected special token in '", w, "'"));
    } else if (m.content_type.empty()) {
      if (w == kConstrainName) return bad("<|constrain|> is not followed by a format");
      m.content_type = w;
    } else {
      return bad(absl::StrCat("unexpected '", w, "' after content type '", m.content_type, "'"));
    }
  }
  return m;
}

StreamParser::StreamParser(const tk::Tokenizer* tokenizer, ParserOptions options)
    : tok_(tokenizer),
      options_(options),
      state_(options.start_role ? State::kHeader : State::kExpectStart),
      header_role_(options.start_role),
      detok_(tokenizer, options.strict ? tk::StreamingDetokenizer::InvalidBytes::kError
                                       : tk::StreamingDetokenizer::InvalidBytes::kReplace) {}

std::string StreamParser::HeaderText() const {
  std::string out;
  for (tk::TokenId t : header_tokens_) {
    auto b = tok_->TokenBytes(t);
    if (b.ok()) out.append(*b);
  }
  return out;
}

absl::Status StreamParser::Fail(const std::string& what, tk::TokenId token) {
  auto name = tok_->TokenBytes(token);
  return absl::InvalidArgumentError(absl::StrCat(
      "completion token ", position_, " (id ", token,
      name.ok() && tk::Tokenizer::IsSpecial(token) ? absl::StrCat(" ", std::string(*name)) : std::string(), "): ", what));
}

absl::Status StreamParser::BeginContent() {
  std::string text = HeaderText();
  absl::Status st = tk::CheckUtf8(text, "message header");
  absl::StatusOr<Message> m = st.ok() ? ParseHeader(text, header_role_) : absl::StatusOr<Message>(st);
  if (!m.ok()) {
    if (options_.strict) return m.status();
    return RecoverHeader(std::string(m.status().message()), false);
  }
  current_ = std::move(*m);
  header_tokens_.clear();
  header_role_.reset();
  state_ = State::kContent;
  return absl::OkStatus();
}

absl::Status StreamParser::RecoverHeader(const std::string& why, bool header_is_content) {
  // Keep what can be read: the channel, a recipient, and (when the header was
  // never closed) the text after the channel name as content.
  std::string text = HeaderText();
  Message m;
  m.role = header_role_.value_or(Role::kAssistant);
  std::string rest;
  size_t at = text.find(kChannelName);
  if (at != std::string::npos) {
    size_t b = at + kChannelName.size(), e = b;
    while (e < text.size() && !IsSpace(text[e]) && text[e] != '<') ++e;
    m.channel = text.substr(b, e - b);
    rest = text.substr(e);
  }
  for (const std::string& w : SplitWords(text)) {
    if (w.rfind("to=", 0) == 0 && m.recipient.empty()) {
      m.recipient = w.substr(3);
      size_t lt = m.recipient.find('<');
      if (lt != std::string::npos) m.recipient.resize(lt);
    }
  }
  warnings_.push_back(absl::StrCat("recovered from a malformed header: ", why));
  current_ = std::move(m);
  header_tokens_.clear();
  header_role_.reset();
  state_ = State::kContent;
  if (header_is_content) {
    size_t b = 0;
    while (b < rest.size() && IsSpace(rest[b])) ++b;
    std::string content = tk::CheckUtf8(rest, "").ok() ? rest.substr(b) : std::string();
    current_.content = content;
    delta_ = content;
  }
  return absl::OkStatus();
}

absl::Status StreamParser::EndMessage(std::optional<tk::TokenId> end_token) {
  auto tail = detok_.Finish();
  if (!tail.ok()) return tail.status();
  current_.content += *tail;
  delta_ += *tail;
  messages_.push_back(std::move(current_));
  end_tokens_.push_back(end_token);
  current_ = Message();
  state_ = State::kExpectStart;
  return absl::OkStatus();
}

absl::StatusOr<StreamParser::Event> StreamParser::Process(tk::TokenId token) {
  delta_.clear();
  ++position_;
  if (!tk::Tokenizer::IsValid(token)) {
    return absl::InvalidArgumentError(absl::StrCat("completion token ", position_, ": id ", token,
                                                   " is outside the vocabulary (0..",
                                                   tk::kVocabSize - 1, ")"));
  }
  const bool special = tk::Tokenizer::IsSpecial(token);
  const bool is_stop = token == tk::kEnd || token == tk::kReturn || token == tk::kCall;
  switch (state_) {
    case State::kExpectStart:
      if (token == tk::kStart) {
        state_ = State::kHeader;
        header_tokens_.clear();
        return Event::kHeaderProgress;
      }
      if (options_.strict) return Fail("expected <|start|> to begin a message", token);
      warnings_.push_back(absl::StrCat("ignored token ", token, " between messages"));
      return Event::kNone;

    case State::kHeader:
      if (token == tk::kMessage) {
        FLOTILLA_RETURN_IF_ERROR(BeginContent());
        return Event::kMessageStarted;
      }
      if (!special || token == tk::kChannel || token == tk::kConstrain) {
        header_tokens_.push_back(token);
        return Event::kHeaderProgress;
      }
      if (is_stop) {
        if (options_.strict) {
          return Fail(absl::StrCat("message ended inside its header '", HeaderText(),
                                   "' (no <|message|>)"), token);
        }
        FLOTILLA_RETURN_IF_ERROR(RecoverHeader("the header was ended before <|message|>", true));
        FLOTILLA_RETURN_IF_ERROR(EndMessage(token));
        return Event::kMessageEnded;
      }
      if (token == tk::kStart) {
        if (options_.strict) return Fail(absl::StrCat("<|start|> inside the header '", HeaderText(), "'"), token);
        warnings_.push_back(absl::StrCat("dropped an unfinished header '", HeaderText(), "'"));
        header_tokens_.clear();
        header_role_.reset();
        return Event::kHeaderProgress;
      }
      if (options_.strict) return Fail("unexpected special token in a header", token);
      warnings_.push_back(absl::StrCat("ignored special token ", token, " in a header"));
      return Event::kNone;

    case State::kContent:
      if (is_stop) {
        FLOTILLA_RETURN_IF_ERROR(EndMessage(token));
        return Event::kMessageEnded;
      }
      if (!special) {
        auto text = detok_.Append(token);
        if (!text.ok()) return Fail(std::string(text.status().message()), token);
        current_.content += *text;
        delta_ = std::move(*text);
        return Event::kContentDelta;
      }
      if (token == tk::kStart && !options_.strict) {
        warnings_.push_back("a message was not ended before the next <|start|>");
        FLOTILLA_RETURN_IF_ERROR(EndMessage(std::nullopt));
        state_ = State::kHeader;
        return Event::kHeaderProgress;
      }
      if (options_.strict) return Fail("unexpected special token in message content", token);
      warnings_.push_back(absl::StrCat("ignored special token ", token, " in message content"));
      return Event::kNone;
  }
  return Event::kNone;
}

absl::Status StreamParser::Finish() {
  delta_.clear();
  switch (state_) {
    case State::kExpectStart:
      return absl::OkStatus();
    case State::kContent:
      return EndMessage(std::nullopt);
    case State::kHeader:
      if (header_tokens_.empty() && header_role_) return absl::OkStatus();  // nothing generated
      if (header_tokens_.empty()) {
        if (options_.strict) return absl::InvalidArgumentError("completion ended right after <|start|>");
        warnings_.push_back("completion ended right after <|start|>");
        return absl::OkStatus();
      }
      if (options_.strict) {
        return absl::InvalidArgumentError(absl::StrCat("completion ended mid-header '", HeaderText(),
                                                       "' (no <|message|>)"));
      }
      FLOTILLA_RETURN_IF_ERROR(RecoverHeader("the completion ended inside a header", true));
      return EndMessage(std::nullopt);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<Message>> ParseCompletion(const tk::Tokenizer& tok,
                                                     const std::vector<tk::TokenId>& tokens,
                                                     const ParserOptions& options) {
  StreamParser parser(&tok, options);
  for (tk::TokenId t : tokens) {
    auto ev = parser.Process(t);
    if (!ev.ok()) return ev.status();
  }
  FLOTILLA_RETURN_IF_ERROR(parser.Finish());
  return parser.messages();
}

}  // namespace flotilla::harmony
