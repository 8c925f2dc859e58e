#include "coordinator/input_limits.h"

#include <gtest/gtest.h>

#include "coordinator/http/openai_pipeline.h"

namespace flotilla::coordinator {
namespace {

const tokenizer::Tokenizer& Tok() {
  static const tokenizer::Tokenizer* tok = [] {
    auto r = tokenizer::Tokenizer::Create(tokenizer::Tokenizer::DefaultRanksPath());
    EXPECT_TRUE(r.ok()) << r.status();
    return r->release();
  }();
  return *tok;
}

TEST(InputLimits, PromptTextLimitIsContextTimesLongestToken) {
  const size_t longest = LongestTokenBytes(Tok());
  // Every token's bytes are at most `longest`: so no text over the limit can
  // fit the context.
  EXPECT_GE(longest, 16u);
  for (tokenizer::TokenId id : {0u, 1000u, 100000u}) {
    EXPECT_LE(Tok().TokenBytes(id)->size(), longest);
  }
  EXPECT_EQ(PromptTextByteLimit(4096, Tok()), 4096 * longest);
  EXPECT_EQ(PromptTextByteLimit(0, Tok()), 0u);
}

TEST(InputLimits, ChecksNameTheLimit) {
  EXPECT_TRUE(CheckPromptTextBytes(100, 100, "prompt").ok());
  EXPECT_TRUE(CheckPromptTextBytes(size_t{1} << 40, 0, "prompt").ok());
  absl::Status st = CheckPromptTextBytes(101, 100, "prompt text");
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("prompt text"), std::string::npos) << st;
  EXPECT_NE(st.message().find("100 bytes"), std::string::npos) << st;
  st = CheckRequestBytes(2000, 1000);
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(st.message().find("--max-request-bytes"), std::string::npos) << st;
  EXPECT_TRUE(CheckRequestBytes(1000, 1000).ok());
}

// A prompt over the limit is refused before it is tokenised: a 64 MiB text
// comes back at once, where tokenising it would take many seconds.
TEST(InputLimits, PipelinesRefuseLongTextsUntokenised) {
  const std::string huge(size_t{64} << 20, 'a');
  Json completion = {{"model", "m"}, {"prompt", huge}};
  absl::StatusOr<PreparedRequest> p = PrepareCompletionRequest(completion, "m", Tok(), 1 << 20);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(p.status().message().find(std::to_string(1 << 20)), std::string::npos) << p.status();

  Json chat = {{"model", "m"},
               {"messages", Json::array({Json{{"role", "user"}, {"content", huge}}})}};
  p = PrepareChatRequest(chat, "m", Tok(), {}, 1 << 20);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);

  // Under the limit (or with none) they are served as before.
  Json small = {{"model", "m"}, {"prompt", "hello world"}};
  EXPECT_TRUE(PrepareCompletionRequest(small, "m", Tok(), 1 << 20).ok());
  EXPECT_TRUE(PrepareCompletionRequest(small, "m", Tok()).ok());
}

cluster::SubmitSequence Request(int prompt_tokens, uint32_t max_tokens) {
  cluster::SubmitSequence r;
  for (int i = 0; i < prompt_tokens; ++i) r.add_prompt_ids(i);
  r.mutable_sampling()->set_max_tokens(max_tokens);
  return r;
}

TEST(ContextLength, OverTheContextIsRefusedWithVllmsMessageAndCode) {
  cluster::SubmitSequence r = Request(15, 10);
  absl::Status st = FitToContext(r, 20);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(),
            "This model's maximum context length is 20 tokens. However, you requested 25 tokens "
            "(15 in the messages, 10 in the completion). Please reduce the length of the messages "
            "or completion (or set truncate_prompt_tokens).");
  EXPECT_EQ(OpenAiErrorCode(st), std::optional<std::string>(kContextLengthExceeded));
  const ApiError e = ErrorFromStatus(st);
  EXPECT_EQ(e.http_status, 400);
  EXPECT_EQ(e.code, "context_length_exceeded");
  // max_tokens unset means "up to the context": only a prompt that leaves no room fails.
  r = Request(19, 0);
  EXPECT_TRUE(FitToContext(r, 20).ok());
  r = Request(20, 0);
  st = FitToContext(r, 20);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("20 tokens in the messages"), std::string::npos) << st;
  // Exactly full is fine and untouched.
  r = Request(10, 10);
  EXPECT_TRUE(FitToContext(r, 20).ok());
  EXPECT_EQ(r.prompt_ids_size(), 10);
  EXPECT_EQ(r.sampling().max_tokens(), 10u);
  // Other errors carry no code.
  EXPECT_FALSE(OpenAiErrorCode(absl::InvalidArgumentError("x")).has_value());
}

TEST(ContextLength, TruncationKeepsThePromptsEndAndShrinksMaxTokens) {
  cluster::SubmitSequence r = Request(30, 10);
  r.mutable_sampling()->set_truncate_prompt_tokens(-1);
  ASSERT_TRUE(FitToContext(r, 20).ok());
  ASSERT_EQ(r.prompt_ids_size(), 19);
  EXPECT_EQ(r.prompt_ids(0), 11);  // the last 19 of 0..29
  EXPECT_EQ(r.prompt_ids(18), 29);
  EXPECT_EQ(r.sampling().max_tokens(), 1u);
  r = Request(30, 4);
  r.mutable_sampling()->set_truncate_prompt_tokens(5);
  ASSERT_TRUE(FitToContext(r, 20).ok());
  EXPECT_EQ(r.prompt_ids_size(), 5);
  EXPECT_EQ(r.prompt_ids(0), 25);
  EXPECT_EQ(r.sampling().max_tokens(), 4u);
  r = Request(3, 4);
  r.mutable_sampling()->set_truncate_prompt_tokens(0);
  EXPECT_EQ(FitToContext(r, 20).code(), absl::StatusCode::kInvalidArgument);
  // The HTTP field reaches the sampling parameters.
  Json body = {{"model", "m"}, {"prompt", "hello"}, {"truncate_prompt_tokens", 7}};
  absl::StatusOr<PreparedRequest> p = PrepareCompletionRequest(body, "m", Tok());
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->sampling.truncate_prompt_tokens(), 7);
  body["truncate_prompt_tokens"] = 0;
  p = PrepareCompletionRequest(body, "m", Tok());
  EXPECT_FALSE(p.ok());
}

}  // namespace
}  // namespace flotilla::coordinator
