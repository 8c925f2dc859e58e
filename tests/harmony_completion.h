// What the coordinator's pipeline tests share: the default o200k tokenizer,
// loaded once, the assistant messages a model writes and the tokens it would
// generate for Harmony messages.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "coordinator/harmony/message.h"
#include "coordinator/harmony/renderer.h"
#include "coordinator/tokenizer/tokenizer.h"

namespace flotilla::test_support {

inline const tokenizer::Tokenizer& Tok() {
  namespace tk = tokenizer;
  static const tk::Tokenizer* t = [] {
    auto r = tk::Tokenizer::Create(tk::Tokenizer::DefaultRanksPath());
    EXPECT_TRUE(r.ok()) << r.status();
    return r->release();
  }();
  return *t;
}

// An assistant message on `channel`; with `to`, a call to that recipient
// whose arguments are JSON.
inline harmony::Message Assistant(const std::string& channel, const std::string& content,
                                  const std::string& to = "") {
  harmony::Message m;
  m.role = harmony::Role::kAssistant;
  m.channel = channel;
  m.content = content;
  m.recipient = to;
  if (!to.empty()) m.content_type = "<|constrain|>json";
  return m;
}

// The tokens the model would generate after `<|start|>assistant` for
// `messages`, without the end token of the last (the worker reports that as
// the stop token, returned in `stop`).
inline std::vector<tokenizer::TokenId> Completion(
    const std::vector<harmony::Message>& messages,
    tokenizer::TokenId* stop) {
  namespace tk = tokenizer;
  harmony::RenderedPrompt p;
  for (const auto& m : messages) EXPECT_TRUE(harmony::RenderMessage(m, true, p).ok());
  std::vector<tk::TokenId> ids = p.Tokens(Tok());
  // Drop `<|start|>` and the "assistant" role token(s) at the front.
  std::vector<tk::TokenId> role = *Tok().EncodeOrdinary("assistant");
  EXPECT_EQ(ids[0], tk::kStart);
  ids.erase(ids.begin(), ids.begin() + 1 + role.size());
  *stop = ids.back();
  ids.pop_back();
  return ids;
}

}  // namespace flotilla::test_support
