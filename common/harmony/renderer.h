// Renders Harmony conversations to prompt text or token ids.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/harmony/message.h"
#include "common/tokenizer/tokenizer.h"

namespace flotilla::harmony {

struct RenderOptions {
  // Leave out `analysis` messages that come before the conversation's last
  // `final` assistant message (earlier turns' chain of thought).
  bool auto_drop_analysis = true;
};

// A rendered prompt: special tokens and text runs, in order. Text runs are
// encoded as ordinary text, so content that merely looks like a special token
// never becomes one.
class RenderedPrompt {
 public:
  struct Segment {
    bool special;
    tokenizer::TokenId id;  // when special
    std::string text;       // the special token's name, or the text
  };
  void AddSpecial(tokenizer::TokenId id, const char* name) { segments_.push_back({true, id, name}); }
  void AddText(std::string text);
  const std::vector<Segment>& segments() const { return segments_; }
  // Special tokens spelled out ("<|start|>user<|message|>...").
  std::string Text() const;
  std::vector<tokenizer::TokenId> Tokens(const tokenizer::Tokenizer& tok) const;

 private:
  std::vector<Segment> segments_;
};

// The text of a system message's content (identity, dates, reasoning effort,
// built-in tools, channels). `has_function_tools` adds the line that sends
// function calls to the commentary channel.
std::string RenderSystemContent(const SystemContent& s, bool has_function_tools);
// The text of a developer message's content: instructions and the `functions`
// namespace. Fails on a malformed tool schema, naming the tool and field.
absl::StatusOr<std::string> RenderDeveloperContent(const DeveloperContent& d);
// One tool's TypeScript-like declaration ("// desc\ntype name = (_: {...}) => any;").
absl::StatusOr<std::string> RenderFunctionTool(const ToolDescription& tool);

// Appends one message, `<|start|>HEADER<|message|>CONTENT` and its end token
// (`<|call|>` for an assistant message to a recipient, else `<|end|>`).
absl::Status RenderMessage(const Message& m, bool has_function_tools, RenderedPrompt& out);

// The whole conversation followed by `<|start|>assistant`, ready for the
// assistant's completion.
absl::StatusOr<RenderedPrompt> RenderForCompletion(const std::vector<Message>& conversation,
                                                   const RenderOptions& options);
// The conversation without a trailing `<|start|>assistant`.
absl::StatusOr<RenderedPrompt> RenderConversation(const std::vector<Message>& conversation,
                                                  const RenderOptions& options);

}  // namespace flotilla::harmony
