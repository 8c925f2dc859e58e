// The typed request (prepared_request.h) from each source, and the one
// SessionRequest builder: OpenAI chat and completions JSON, Responses JSON,
// flotilla.v1 ChatRequest and GenerateRequest, each with what it refuses.
#include "coordinator/session_request.h"

#include <gtest/gtest.h>

#include "coordinator/grpc/chat_pipeline.h"
#include "coordinator/grpc/generate_request.h"
#include "coordinator/http/openai_pipeline.h"
#include "coordinator/http/responses_request.h"
#include "tests/harmony_completion.h"

namespace flotilla::coordinator {
namespace {

namespace tk = tokenizer;
using test_support::Tok;

constexpr char kModel[] = "gpt-oss-20b";

using test_support::Encode;

SessionContext Context(std::string call_id_seed, uint64_t cache_domain = 0,
                       std::string default_route_key = "") {
  SessionContext context;
  context.call_id_seed = std::move(call_id_seed);
  context.cache_domain = cache_domain;
  context.default_route_key = std::move(default_route_key);
  return context;
}

TEST(SessionRequestTest, OpenAiChatBecomesOneHarmonySession) {
  const Json body = Json::parse(R"({
    "model": "gpt-oss-20b", "n": 2, "stop": ["END"], "seed": 7, "max_tokens": 50,
    "prompt_cache_key": "tenant-a",
    "messages": [{"role": "user", "content": "Say hi"}],
    "response_format": {"type": "json_object"}})");
  absl::StatusOr<PreparedRequest> prepared =
      PrepareChatRequest(body, kModel, Tok(), harmony::OpenAiRequestOptions());
  ASSERT_TRUE(prepared.ok()) << prepared.status();
  EXPECT_EQ(prepared->endpoint, Endpoint::kChat);
  SessionRequest s = SessionRequestOf(*prepared, Context("chatcmpl-1", 9, "hdr"));
  EXPECT_EQ(s.decoding, Decoding::kHarmony);
  ASSERT_EQ(s.prompts.size(), 1u);
  EXPECT_EQ(s.prompts[0], prepared->prompt);
  EXPECT_EQ(s.n, 2u);
  EXPECT_EQ(s.stop, std::vector<std::string>{"END"});
  EXPECT_EQ(s.submit.sampling().seed(), 7u);
  EXPECT_EQ(s.submit.sampling().max_tokens(), 50u);
  EXPECT_TRUE(s.submit.has_constraint());
  EXPECT_EQ(s.submit.cache_domain(), 9u);
  EXPECT_EQ(s.call_id_seed, "chatcmpl-1");
  EXPECT_EQ(s.route_key, "tenant-a");  // the request's key wins over the header
  EXPECT_FALSE(s.submit.return_prompt_logits());
}

TEST(SessionRequestTest, OpenAiChatErrorsNameTheField) {
  const Json body = Json::parse(R"({"messages": [{"role": "user", "content": "hi"}],
                                    "temperature": 3})");
  absl::StatusOr<PreparedRequest> prepared =
      PrepareChatRequest(body, kModel, Tok(), harmony::OpenAiRequestOptions());
  ASSERT_EQ(prepared.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(prepared.status().message().substr(0, 12), "temperature:");
}

TEST(SessionRequestTest, BatchedCompletionsAreTextSessionsOfEveryPrompt) {
  const Json body =
      Json::parse(R"({"model": "gpt-oss-20b", "prompt": ["one", "two"], "n": 3, "echo": true})");
  absl::StatusOr<PreparedRequest> prepared = PrepareCompletionRequest(body, kModel, Tok());
  ASSERT_TRUE(prepared.ok()) << prepared.status();
  SessionRequest s = SessionRequestOf(*prepared, Context("", 0, "session-7"));
  EXPECT_EQ(s.decoding, Decoding::kText);
  ASSERT_EQ(s.prompts.size(), 2u);
  EXPECT_EQ(s.prompts[0], Encode("one"));
  EXPECT_EQ(s.prompts[1], Encode("two"));
  EXPECT_EQ(s.n, 3u);
  EXPECT_TRUE(s.echo);
  EXPECT_EQ(s.route_key, "session-7");  // none in the request: the header's
}

TEST(SessionRequestTest, ResponsesBecomeOneHarmonySession) {
  const Json body = Json::parse(R"({"model": "gpt-oss-20b", "input": "Say hi",
                                    "instructions": "Be brief", "max_output_tokens": 20})");
  absl::StatusOr<ResponsesRequest> request = ParseResponsesRequest(body);
  ASSERT_TRUE(request.ok()) << request.status();
  absl::StatusOr<PreparedRequest> prepared = PrepareResponsesRequest(
      *request, Json::array(), kModel, Tok(), harmony::OpenAiRequestOptions());
  ASSERT_TRUE(prepared.ok()) << prepared.status();
  SessionRequest s = SessionRequestOf(*prepared, Context("resp_1"));
  EXPECT_EQ(s.decoding, Decoding::kHarmony);
  ASSERT_EQ(s.prompts.size(), 1u);
  EXPECT_FALSE(s.prompts[0].empty());
  EXPECT_EQ(s.n, 1u);
  EXPECT_EQ(s.submit.sampling().max_tokens(), 20u);
  EXPECT_EQ(s.call_id_seed, "resp_1");
}

TEST(SessionRequestTest, ResponsesErrorsNameTheResponsesField) {
  const Json body = Json::parse(R"({"input": 5})");
  absl::StatusOr<ResponsesRequest> request = ParseResponsesRequest(body);
  ASSERT_EQ(request.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(request.status().message().substr(0, 6), "input:");
}

TEST(SessionRequestTest, ProtoChatMatchesTheOpenAiChatOfTheSameConversation) {
  v1::ChatRequest chat;
  v1::ChatMessage* m = chat.add_messages();
  m->set_role(v1::ChatMessage::USER);
  m->set_content("Say hi");
  chat.mutable_sampling()->set_seed(3);
  chat.set_n(2);
  absl::StatusOr<PreparedRequest> from_proto =
      PrepareChat(chat, kModel, Tok(), harmony::OpenAiRequestOptions());
  ASSERT_TRUE(from_proto.ok()) << from_proto.status();
  const Json body = Json::parse(R"({"model": "gpt-oss-20b", "n": 2, "seed": 3,
                    "messages": [{"role": "user", "content": "Say hi"}]})");
  absl::StatusOr<PreparedRequest> from_json =
      PrepareChatRequest(body, kModel, Tok(), harmony::OpenAiRequestOptions());
  ASSERT_TRUE(from_json.ok()) << from_json.status();
  SessionRequest a = SessionRequestOf(*from_proto, Context("c"));
  SessionRequest b = SessionRequestOf(*from_json, Context("c"));
  EXPECT_EQ(a.decoding, Decoding::kHarmony);
  EXPECT_EQ(a.prompts, b.prompts);
  EXPECT_EQ(a.n, 2u);
  EXPECT_EQ(a.submit.sampling().seed(), b.submit.sampling().seed());
  EXPECT_EQ(a.submit.sampling().stop_token_ids_size(), b.submit.sampling().stop_token_ids_size());
}

TEST(SessionRequestTest, ProtoChatErrorsNameTheProtoField) {
  v1::ChatRequest chat;
  absl::StatusOr<PreparedRequest> empty =
      PrepareChat(chat, kModel, Tok(), harmony::OpenAiRequestOptions());
  ASSERT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(empty.status().message().substr(0, 9), "messages:");
  v1::ChatMessage* m = chat.add_messages();
  m->set_role(v1::ChatMessage::USER);
  m->set_content("hi");
  chat.mutable_sampling()->set_temperature(5);
  absl::StatusOr<PreparedRequest> hot =
      PrepareChat(chat, kModel, Tok(), harmony::OpenAiRequestOptions());
  ASSERT_EQ(hot.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(hot.status().message().substr(0, 21), "sampling.temperature:");
  chat.clear_sampling();
  chat.set_model("another-model");
  EXPECT_EQ(PrepareChat(chat, kModel, Tok(), harmony::OpenAiRequestOptions()).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(SessionRequestTest, GenerateTextOrIdsBecomesATextSession) {
  v1::GenerateRequest generate;
  generate.set_text("Once upon");
  generate.set_n(2);
  generate.set_return_prompt_logits(true);
  generate.mutable_sampling()->set_max_tokens(5);
  absl::StatusOr<PreparedRequest> prepared = PrepareGenerate(generate, kModel, Tok());
  ASSERT_TRUE(prepared.ok()) << prepared.status();
  SessionRequest s = SessionRequestOf(*prepared, Context("", 4));
  EXPECT_EQ(s.decoding, Decoding::kText);
  ASSERT_EQ(s.prompts.size(), 1u);
  EXPECT_EQ(s.prompts[0], Encode("Once upon"));
  EXPECT_EQ(s.n, 2u);
  EXPECT_TRUE(s.submit.return_prompt_logits());
  EXPECT_EQ(s.submit.sampling().max_tokens(), 5u);
  EXPECT_EQ(s.submit.cache_domain(), 4u);

  v1::GenerateRequest ids;
  ids.mutable_prompt_ids()->add_ids(1);
  ids.mutable_prompt_ids()->add_ids(2);
  prepared = PrepareGenerate(ids, kModel, Tok());
  ASSERT_TRUE(prepared.ok()) << prepared.status();
  EXPECT_EQ(SessionRequestOf(*prepared, SessionContext()).prompts[0],
            (std::vector<tk::TokenId>{1, 2}));
  EXPECT_EQ(SessionRequestOf(*prepared, SessionContext()).n, 1u);  // n = 0 is one choice
}

TEST(SessionRequestTest, GenerateErrorsNameWhatIsWrong) {
  v1::GenerateRequest none;
  absl::Status st = PrepareGenerate(none, kModel, Tok()).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(), "the request has no prompt");

  v1::GenerateRequest many;
  many.set_text("x");
  many.set_n(17);
  st = PrepareGenerate(many, kModel, Tok()).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(), "n: must be at most 16, not 17");

  v1::GenerateRequest other;
  other.set_text("x");
  other.set_model("other");
  st = PrepareGenerate(other, kModel, Tok()).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound);

  v1::GenerateRequest bad_text;
  bad_text.set_text(std::string("\xff\xfe", 2));
  st = PrepareGenerate(bad_text, kModel, Tok()).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message().substr(0, 12), "prompt text:");
}

}  // namespace
}  // namespace flotilla::coordinator
