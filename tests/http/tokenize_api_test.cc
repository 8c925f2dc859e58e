// /tokenize and /detokenize bodies against the real o200k_harmony tokenizer,
// and the --served-model-name rules.
#include "coordinator/http/tokenize_api.h"

#include <gtest/gtest.h>

#include "coordinator/http/openai_pipeline.h"
#include "coordinator/served_models.h"
#include "tests/harmony_completion.h"

namespace flotilla::coordinator {
namespace {

namespace tk = tokenizer;

using test_support::Tok;

TokenizeContext Context() {
  TokenizeContext c;
  c.tok = &Tok();
  c.model_id = "gpt-oss";
  c.max_model_len = 4096;
  return c;
}

TEST(Tokenize, PromptGivesTheCompletionsTokens) {
  const Json body = Json::parse(R"({"prompt": "Hello world<|end|>", "return_token_strs": true})");
  auto r = Tokenize(body, Context());
  ASSERT_TRUE(r.ok()) << r.status();
  const std::vector<tk::TokenId> want = *Tok().Encode("Hello world<|end|>", tk::SpecialTokenPolicy::All());
  EXPECT_EQ((*r)["tokens"].get<std::vector<tk::TokenId>>(), want);
  EXPECT_EQ((*r)["count"], want.size());
  EXPECT_EQ((*r)["max_model_len"], 4096);
  EXPECT_EQ((*r)["token_strs"], Json::parse(R"(["Hello", " world", "<|end|>"])"));
  auto plain = Tokenize(Json::parse(R"({"prompt": "Hi", "model": "gpt-oss"})"), Context());
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_TRUE((*plain)["token_strs"].is_null());
}

TEST(Tokenize, MessagesGiveTheChatPrompt) {
  const Json body = Json::parse(R"({"model": "gpt-oss", "messages": [{"role": "user", "content": "Hi"}]})");
  auto r = Tokenize(body, Context());
  ASSERT_TRUE(r.ok()) << r.status();
  auto chat = PrepareChatRequest(body, "gpt-oss", Tok(), harmony::OpenAiRequestOptions());
  ASSERT_TRUE(chat.ok()) << chat.status();
  EXPECT_EQ((*r)["tokens"].get<std::vector<tk::TokenId>>(), chat->prompt);
  auto text = Tok().DecodeUtf8(chat->prompt);
  ASSERT_TRUE(text.ok());
  EXPECT_TRUE(text->ends_with("<|start|>user<|message|>Hi<|end|><|start|>assistant")) << *text;

  Json no_header = body;
  no_header["add_generation_prompt"] = false;
  auto bare = Tokenize(no_header, Context());
  ASSERT_TRUE(bare.ok()) << bare.status();
  auto bare_text = Tok().DecodeUtf8((*bare)["tokens"].get<std::vector<tk::TokenId>>());
  EXPECT_TRUE(bare_text->ends_with("<|start|>user<|message|>Hi<|end|>")) << *bare_text;
}

TEST(Tokenize, BadRequestsNameTheField) {
  struct Bad {
    const char* body;
    absl::StatusCode code;
    const char* expect;
  } cases[] = {
      {R"({})", absl::StatusCode::kInvalidArgument, "exactly one of prompt and messages"},
      {R"({"prompt": "a", "messages": []})", absl::StatusCode::kInvalidArgument, "exactly one"},
      {R"({"prompt": 5})", absl::StatusCode::kInvalidArgument, "prompt"},
      {R"({"prompt": "a", "return_token_strs": "yes"})", absl::StatusCode::kInvalidArgument, "return_token_strs"},
      {R"({"prompt": "a", "model": "other"})", absl::StatusCode::kNotFound, "'other' does not exist"},
      {R"({"messages": [{"role": "wizard", "content": "x"}]})", absl::StatusCode::kInvalidArgument, "role"},
      {R"({"messages": [{"role": "user", "content": "x"}], "continue_final_message": true})",
       absl::StatusCode::kInvalidArgument, "continue_final_message"},
      {R"([1, 2])", absl::StatusCode::kInvalidArgument, "JSON object"},
  };
  for (const auto& c : cases) {
    auto r = Tokenize(Json::parse(c.body), Context());
    ASSERT_FALSE(r.ok()) << c.body;
    EXPECT_EQ(r.status().code(), c.code) << c.body << " -> " << r.status();
    EXPECT_NE(std::string(r.status().message()).find(c.expect), std::string::npos) << c.body << " -> " << r.status();
  }
}

TEST(Detokenize, TokensBackToText) {
  const std::vector<tk::TokenId> ids = *Tok().Encode("héllo <|start|>", tk::SpecialTokenPolicy::All());
  auto r = Detokenize(Json{{"tokens", ids}, {"model", "gpt-oss"}}, Context());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)["prompt"], "héllo <|start|>");
  // A lone continuation byte of a split character is replaced, not an error.
  const std::vector<tk::TokenId> e_acute = *Tok().EncodeOrdinary("é");
  std::vector<tk::TokenId> partial;
  for (tk::TokenId id : e_acute) {
    if (Tok().TokenBytes(id)->size() == 1) partial.push_back(id);
  }
  if (!partial.empty()) {
    auto lossy = Detokenize(Json{{"tokens", Json::array({partial[0]})}}, Context());
    ASSERT_TRUE(lossy.ok()) << lossy.status();
    EXPECT_EQ((*lossy)["prompt"], "\xEF\xBF\xBD");
  }
}

TEST(Detokenize, BadTokensNameTheIndex) {
  for (const char* body : {R"({"tokens": [1, -1]})", R"({"tokens": [1, 300000]})", R"({"tokens": [1, "a"]})"}) {
    auto r = Detokenize(Json::parse(body), Context());
    ASSERT_FALSE(r.ok()) << body;
    EXPECT_NE(std::string(r.status().message()).find("tokens[1]"), std::string::npos) << r.status();
  }
  EXPECT_FALSE(Detokenize(Json::parse(R"({})"), Context()).ok());
  EXPECT_FALSE(Detokenize(Json::parse(R"({"tokens": 5})"), Context()).ok());
  EXPECT_EQ(Detokenize(Json::parse(R"({"tokens": [], "model": "x"})"), Context()).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(ServedModelNames, FirstNameLeadsAndEveryNameResolves) {
  EXPECT_EQ(*ServedModelNames({}, "dir-name"), std::vector<std::string>{"dir-name"});
  auto names = ServedModelNames({"gpt-oss-120b", "openai/gpt-oss-120b"}, "dir-name");
  ASSERT_TRUE(names.ok());
  EXPECT_EQ(ResolveModelName(*names, "openai/gpt-oss-120b"), "openai/gpt-oss-120b");
  EXPECT_EQ(ResolveModelName(*names, "gpt-oss-120b"), "gpt-oss-120b");
  EXPECT_EQ(ResolveModelName(*names, "dir-name"), "gpt-oss-120b");
  EXPECT_FALSE(ServedModelNames({"a", ""}, "m").ok());
  auto twice = ServedModelNames({"a", "b", "a"}, "m");
  ASSERT_FALSE(twice.ok());
  EXPECT_NE(std::string(twice.status().message()).find("'a' is given twice"), std::string::npos);
}

TEST(ServedModelNames, MaxModelLenIsTheSmallerOfFlagAndContext) {
  ClusterOptions o;
  o.model.max_position_embeddings = 131072;
  EXPECT_EQ(MaxModelLen(o), 131072u);
  o.max_model_len = 8192;
  EXPECT_EQ(MaxModelLen(o), 8192u);
  o.max_model_len = 1 << 20;
  EXPECT_EQ(MaxModelLen(o), 131072u);
}

}  // namespace
}  // namespace flotilla::coordinator
