// What the coordinator's pipeline tests share: the default o200k tokenizer,
// loaded once, the assistant messages a model writes and the tokens it would
// generate for Harmony messages.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/harmony/message.h"
#include "common/harmony/renderer.h"
#include "common/tokenizer/tokenizer.h"

namespace flotilla::test_support {

// The default o200k_harmony tokenizer, loaded once; without its ranks file the
// test fails saying where it looked, and the program stops.
inline const tokenizer::Tokenizer& Tok() {
  namespace tk = tokenizer;
  static const tk::Tokenizer* tok = [] {
    auto t = tk::Tokenizer::Create(tk::Tokenizer::DefaultRanksPath());
    return t.ok() ? t->release() : nullptr;
  }();
  if (tok == nullptr) {
    ADD_FAILURE() << "tokenizer ranks not found at " << tk::Tokenizer::DefaultRanksPath();
    std::abort();
  }
  return *tok;
}

// `text` as ordinary tokens (special tokens' text stays text).
inline std::vector<tokenizer::TokenId> Encode(const std::string& text) {
  return *Tok().EncodeOrdinary(text);
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

// The pipeline tests' get_weather tool as an OpenAI chat `tools` entry,
// `properties` its parameters' properties (in order, as a client sent them).
inline nlohmann::ordered_json WeatherTool(const nlohmann::ordered_json& properties) {
  return {{"type", "function"},
          {"function",
           {{"name", "get_weather"},
            {"description", "Gets the weather"},
            {"parameters", {{"type", "object"}, {"properties", properties}}}}}};
}

// Expects the rendered prompt `text` to hold the assistant's get_weather call
// with `arguments`, then the tool's answer {"temp_c": 21}, and to end where
// the assistant's next message begins.
inline void ExpectWeatherRoundTrip(const std::string& text, const std::string& arguments) {
  EXPECT_NE(text.find("<|start|>assistant to=functions.get_weather<|channel|>commentary "
                      "<|constrain|>json<|message|>" +
                      arguments + "<|call|>"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"
                      "{\"temp_c\": 21}<|end|><|start|>assistant"),
            std::string::npos)
      << text;
  EXPECT_TRUE(text.ends_with("<|start|>assistant"));
}

// Expects a chat request's stop tokens to be Harmony's: <|return|>, <|call|>.
template <typename Sampling>
void ExpectHarmonyStops(const Sampling& sampling) {
  ASSERT_EQ(sampling.stop_token_ids_size(), 2);
  EXPECT_EQ(sampling.stop_token_ids(0), static_cast<int>(tokenizer::kReturn));
  EXPECT_EQ(sampling.stop_token_ids(1), static_cast<int>(tokenizer::kCall));
}

}  // namespace flotilla::test_support
