#include "coordinator/input_limits.h"

#include <gtest/gtest.h>

#include "coordinator/openai_pipeline.h"

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

}  // namespace
}  // namespace flotilla::coordinator
