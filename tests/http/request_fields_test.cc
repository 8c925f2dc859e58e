// The request field policy on the Responses API (request_fields.h): every
// field of OpenAI's ResponseCreateParams is accepted with a value a client
// sends; unknown fields, top-level and in `reasoning`, `text` and
// `stream_options`, are ignored and named, or refused by name under
// UnknownFields::kRefuse; vLLM's extras reach the chat pipeline.
#include "coordinator/http/request_fields.h"

#include <gtest/gtest.h>

#include <map>

#include "coordinator/http/openai_pipeline.h"
#include "coordinator/http/responses_request.h"
#include "tests/harmony_completion.h"

namespace flotilla::coordinator {
namespace {

using test_support::Tok;

absl::StatusOr<PreparedRequest> Prepare(const Json& body, UnknownFields unknown) {
  absl::StatusOr<ResponsesRequest> r = ParseResponsesRequest(body, nullptr, unknown);
  if (!r.ok()) return r.status();
  return PrepareResponsesRequest(*r, Json::array(), "m", Tok(), {});
}

TEST(ResponsesFieldPolicy, EveryOpenAiFieldIsAcceptedAndUnknownOnesAreNamed) {
  const Json tool = {{"type", "function"}, {"name", "f"}, {"parameters", {{"type", "object"}}}};
  const std::map<std::string, Json> sample = {
      {"access_programs", nullptr}, {"background", false}, {"background_options", Json::object()},
      {"context_management", Json::array()}, {"conversation", nullptr}, {"image", nullptr},
      {"include", Json::array()}, {"input", "hi"}, {"instructions", "Be brief."},
      {"max_output_tokens", 64}, {"max_tool_calls", 1}, {"metadata", {{"k", "v"}}}, {"model", "m"},
      {"moderation", Json::object()}, {"parallel_tool_calls", true}, {"previous_response_id", nullptr},
      {"prompt", nullptr}, {"prompt_cache_key", "user-42"}, {"prompt_cache_options", Json::object()},
      {"prompt_cache_retention", "in_memory"}, {"reasoning", {{"effort", "low"}, {"summary", "auto"}}},
      {"safety_identifier", "hash-1"}, {"service_tier", "priority"}, {"store", false}, {"stream", true},
      {"stream_options", {{"include_obfuscation", false}}}, {"temperature", 0.5},
      {"text", {{"verbosity", "low"}, {"format", {{"type", "text"}}}}}, {"tool_choice", "auto"},
      {"tools", Json::array({tool})}, {"top_logprobs", 0}, {"top_p", 0.9}, {"truncation", "disabled"},
      {"user", "u1"}, {"top_k", 5}, {"min_p", 0.05}, {"repetition_penalty", 1.1},
      {"logit_bias", {{"13", 1}}}, {"frequency_penalty", 0.1}, {"presence_penalty", 0.1}, {"seed", 3},
      {"cache_salt", "s"}, {"stop_token_ids", {13}}, {"min_tokens", 2},
      {"chat_template_kwargs", {{"model_identity", "You are a test."}}}};
  Json all = Json::object();
  for (const char* field : ResponsesFields()) {
    ASSERT_TRUE(sample.count(field)) << field << " needs a sample value";
    all[field] = sample.at(field);
  }
  absl::StatusOr<PreparedRequest> p = Prepare(all, UnknownFields::kRefuse);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(p->ignored_fields.empty());
  EXPECT_EQ(p->sampling.min_tokens(), 2u);
  EXPECT_EQ(p->sampling.stop_token_ids(p->sampling.stop_token_ids_size() - 1), 13);
  EXPECT_NE(Tok().DecodeUtf8(p->prompt)->find("You are a test."), std::string::npos);

  const Json extra = {{"model", "m"},
                      {"input", "hi"},
                      {"guided_regex", "a+"},
                      {"reasoning", {{"effort", "low"}, {"budget", 9}}},
                      {"text", {{"format", {{"type", "text"}}}, {"style", "terse"}}},
                      {"stream_options", {{"include_usage", true}}},
                      {"chat_template_kwargs", {{"thinking", true}}}};
  absl::StatusOr<PreparedRequest> ignored = Prepare(extra, UnknownFields::kIgnore);
  ASSERT_TRUE(ignored.ok()) << ignored.status();
  EXPECT_EQ(ignored->ignored_fields,
            (std::vector<std::string>{"guided_regex", "reasoning.budget", "text.style",
                                      "stream_options.include_usage", "chat_template_kwargs.thinking"}));
  for (const char* field : {"guided_regex", "reasoning", "text", "stream_options", "chat_template_kwargs"}) {
    Json one = {{"model", "m"}, {"input", "hi"}};
    one[field] = extra[field];
    absl::StatusOr<PreparedRequest> refused = Prepare(one, UnknownFields::kRefuse);
    ASSERT_FALSE(refused.ok()) << field;
    const ApiError e = ErrorFromStatus(refused.status());
    EXPECT_EQ(e.http_status, 400);
    EXPECT_EQ(e.param.substr(0, std::string(field).size()), field) << e.message;
  }
  // Values that ask for what this server cannot do are refused by name.
  for (const auto& [field, value] : std::vector<std::pair<std::string, Json>>{
           {"conversation", "conv_1"}, {"prompt", {{"id", "pmpt_1"}}}, {"max_tool_calls", 0}}) {
    Json one = {{"model", "m"}, {"input", "hi"}, {field, value}};
    absl::StatusOr<PreparedRequest> refused = Prepare(one, UnknownFields::kIgnore);
    ASSERT_FALSE(refused.ok()) << field;
    EXPECT_EQ(ErrorFromStatus(refused.status()).param, field);
  }
}

}  // namespace
}  // namespace flotilla::coordinator
