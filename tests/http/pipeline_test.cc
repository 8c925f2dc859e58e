// The OpenAI response pipeline fed from recorded token sequences: Harmony
// replies rendered with the real renderer and tokenizer go through the
// ResponseBuilder, whole and streamed; request validation names its fields.
#include <gtest/gtest.h>

#include <map>

#include "absl/strings/str_join.h"
#include "common/harmony/renderer.h"
#include "coordinator/http/openai_pipeline.h"
#include "tests/harmony_completion.h"

namespace flotilla::coordinator {
namespace {

namespace tk = tokenizer;
using test_support::Assistant, test_support::Completion, test_support::Tok;

Json StreamAndMerge(ResponseBuilder& b, const std::vector<tk::TokenId>& ids, tk::TokenId stop,
                    std::vector<Json>* chunks) {
  for (Json& c : b.Begin()) chunks->push_back(c);
  for (tk::TokenId t : ids) {
    for (Json& c : b.Feed({t}, {})) chunks->push_back(c);
  }
  for (Json& c : b.Finish(common::STOP, stop, 10, static_cast<uint32_t>(ids.size() + 1))) chunks->push_back(c);
  return b.Response();
}

TEST(ResponsePipelineTest, ToolCallReplyBecomesToolCalls) {
  tk::TokenId stop;
  std::vector<tk::TokenId> ids =
      Completion({Assistant("analysis", "The user wants the weather; call the tool."),
                  Assistant("commentary", R"({"location":"Tokyo, JP","format":"celsius"})",
                            "functions.get_weather")},
                 &stop);
  EXPECT_EQ(stop, tk::kCall);
  ResponseBuilder b(&Tok(), Endpoint::kChat, "chatcmpl-test", "m", 1, {}, false);
  std::vector<Json> chunks;
  Json r = StreamAndMerge(b, ids, stop, &chunks);
  ASSERT_EQ(r["choices"].size(), 1u);
  const Json& choice = r["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "tool_calls");
  const Json& msg = choice["message"];
  EXPECT_TRUE(msg["content"].is_null());
  EXPECT_EQ(msg["reasoning_content"], "The user wants the weather; call the tool.");
  ASSERT_EQ(msg["tool_calls"].size(), 1u);
  const Json& call = msg["tool_calls"][0];
  EXPECT_EQ(call["type"], "function");
  EXPECT_EQ(call["function"]["name"], "get_weather");
  Json args = Json::parse(call["function"]["arguments"].get<std::string>());
  EXPECT_EQ(args["location"], "Tokyo, JP");
  EXPECT_EQ(args["format"], "celsius");
  EXPECT_EQ(call["id"].get<std::string>().rfind("call_", 0), 0u);
  EXPECT_EQ(r["usage"]["completion_tokens"], ids.size() + 1);
  EXPECT_EQ(r["usage"]["total_tokens"], ids.size() + 11);

  // The streamed deltas add up to the same message.
  std::string streamed_args, streamed_reasoning, name, id;
  std::string last_finish;
  for (const Json& c : chunks) {
    EXPECT_EQ(c["object"], "chat.completion.chunk");
    const Json& ch = c["choices"][0];
    if (!ch["finish_reason"].is_null()) last_finish = ch["finish_reason"];
    const Json& d = ch["delta"];
    if (d.contains("reasoning_content")) streamed_reasoning += d["reasoning_content"].get<std::string>();
    if (d.contains("tool_calls")) {
      for (const Json& tc : d["tool_calls"]) {
        EXPECT_EQ(tc["index"], 0);
        if (tc.contains("id")) id = tc["id"];
        if (tc["function"].contains("name")) name = tc["function"]["name"];
        streamed_args += tc["function"]["arguments"].get<std::string>();
      }
    }
  }
  EXPECT_EQ(last_finish, "tool_calls");
  EXPECT_EQ(name, "get_weather");
  EXPECT_EQ(id, call["id"]);
  EXPECT_EQ(streamed_args, call["function"]["arguments"]);
  EXPECT_EQ(streamed_reasoning, msg["reasoning_content"]);

  // The follow-up request with the tool result renders as Harmony expects:
  // the call, then the tool's message to the assistant.
  Json follow = {
      {"model", "m"},
      {"messages",
       {{{"role", "user"}, {"content", "Weather in Tokyo?"}},
        {{"role", "assistant"}, {"content", nullptr}, {"tool_calls", msg["tool_calls"]}},
        {{"role", "tool"}, {"tool_call_id", call["id"]}, {"content", R"({"temp_c": 21})"}}}},
      {"tools", Json::array({test_support::WeatherTool(
                    {{"location", {{"type", "string"}}}, {"format", {{"type", "string"}}}})})}};
  absl::StatusOr<PreparedRequest> p = PrepareChatRequest(follow, "m", Tok(), {});
  ASSERT_TRUE(p.ok()) << p.status();
  test_support::ExpectWeatherRoundTrip(*Tok().DecodeUtf8(p->prompt),
                                       R"({"location":"Tokyo, JP","format":"celsius"})");
  test_support::ExpectHarmonyStops(p->sampling);
}

// max_tokens that end a function call mid-arguments: the choice is
// "length", streamed and whole (its arguments are not a finished call), and
// so is what the decoder reports to the access log and the other APIs; the
// same call ended by <|call|> is "tool_calls".
TEST(ResponsePipelineTest, ToolCallCutByTheLengthLimitIsLength) {
  tk::TokenId stop;
  const std::vector<tk::TokenId> ids = Completion(
      {Assistant("commentary", R"({"location":"Tokyo, JP","format":"celsius"})", "functions.get_weather")},
      &stop);
  for (size_t cut : {ids.size() - 3, ids.size() / 2, ids.size()}) {
    std::vector<tk::TokenId> head(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(cut));
    ResponseBuilder b(&Tok(), Endpoint::kChat, "chatcmpl-cut", "m", 1, {}, false);
    std::string last_finish;
    for (const Json& c : b.Feed(head, {})) EXPECT_TRUE(c["choices"][0]["finish_reason"].is_null());
    for (const Json& c : b.Finish(common::LENGTH, std::nullopt, 10, static_cast<uint32_t>(cut))) {
      if (!c["choices"][0]["finish_reason"].is_null()) last_finish = c["choices"][0]["finish_reason"];
    }
    EXPECT_EQ(last_finish, "length") << cut;
    const Json whole = b.Response()["choices"][0];
    EXPECT_EQ(whole["finish_reason"], "length") << cut;
    // The cut call is left out of the whole message.
    EXPECT_FALSE(whole["message"].contains("tool_calls")) << whole.dump();
    EXPECT_EQ(whole["message"]["content"], "");
  }
  EXPECT_EQ(FinishReasonName(common::LENGTH, true), "length");
  EXPECT_EQ(FinishReasonName(common::STOP, true), "tool_calls");
  EXPECT_EQ(FinishReasonName(common::STOP, false), "stop");
  EXPECT_EQ(FinishReasonName(common::LENGTH, false), "length");

  // The events a session reports: kFinish carries the reason every API and
  // the access log use.
  ChoiceDecoder decoder(&Tok(), Decoding::kHarmony, 0, "seed", {});
  std::vector<RequestEvent> events;
  decoder.Feed(ids, events);
  decoder.Finish(common::STOP, stop, TokenUsage{10, static_cast<uint32_t>(ids.size() + 1)}, events);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back().kind, RequestEvent::Kind::kFinish);
  EXPECT_EQ(events.back().finish_reason, "tool_calls");
}

TEST(ResponsePipelineTest, FinalAnswerWithStopString) {
  tk::TokenId stop;
  std::vector<tk::TokenId> ids =
      Completion({Assistant("analysis", "Think."), Assistant("final", "One, two, three. Four, five.")}, &stop);
  // A final message rendered for a prompt ends with <|end|>; the model ends with <|return|>.
  stop = tk::kReturn;
  {
    ResponseBuilder b(&Tok(), Endpoint::kChat, "x", "m", 1, {}, false);
    std::vector<Json> chunks;
    Json r = StreamAndMerge(b, ids, stop, &chunks);
    EXPECT_EQ(r["choices"][0]["message"]["content"], "One, two, three. Four, five.");
    EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");
    EXPECT_FALSE(r["choices"][0]["message"].contains("tool_calls"));
  }
  {
    ResponseBuilder b(&Tok(), Endpoint::kChat, "x", "m", 1, {"three.", "zzz"}, false);
    std::vector<Json> chunks;
    for (tk::TokenId t : ids) {
      for (Json& c : b.Feed({t}, {})) chunks.push_back(c);
      if (b.stopped_by_string()) break;
    }
    EXPECT_TRUE(b.stopped_by_string());
    b.Finish(common::STOP, std::nullopt, 1, 2);
    Json r = b.Response();
    EXPECT_EQ(r["choices"][0]["message"]["content"], "One, two, ");
    EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");
    std::string streamed;
    for (const Json& c : chunks) {
      if (c["choices"][0]["delta"].contains("content")) streamed += c["choices"][0]["delta"]["content"];
    }
    EXPECT_EQ(streamed, "One, two, ");
  }
  {
    // Cut by the length limit in the middle of the answer.
    ResponseBuilder b(&Tok(), Endpoint::kChat, "x", "m", 1, {}, false);
    std::vector<tk::TokenId> cut(ids.begin(), ids.end() - 2);
    b.Feed(cut, {});
    b.Finish(common::LENGTH, std::nullopt, 1, static_cast<uint32_t>(cut.size()));
    EXPECT_EQ(b.Response()["choices"][0]["finish_reason"], "length");
  }
}

TEST(StopFilterTest, HoldsBackPrefixesAcrossPieces) {
  StopFilter f({"END", "xy"});
  EXPECT_EQ(f.Push("abc E"), "abc ");
  EXPECT_EQ(f.Push("N"), "");
  EXPECT_EQ(f.Push("d x"), "ENd ");
  EXPECT_EQ(f.Push("yz"), "");
  EXPECT_TRUE(f.hit());
  EXPECT_EQ(f.Push("more"), "");
  StopFilter g({"END"});
  EXPECT_EQ(g.Push("abcEN"), "abc");
  EXPECT_EQ(g.Flush(), "EN");
  EXPECT_FALSE(g.hit());
}

TEST(PrepareRequestTest, ErrorsNameTheField) {
  auto err = [](const Json& body) {
    absl::StatusOr<PreparedRequest> p = PrepareChatRequest(body, "m", Tok(), {});
    EXPECT_FALSE(p.ok()) << body.dump();
    return p.ok() ? ApiError{} : ErrorFromStatus(p.status());
  };
  Json ok = {{"model", "m"}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}};
  ASSERT_TRUE(PrepareChatRequest(ok, "m", Tok(), {}).ok());
  struct Case {
    const char* key;
    Json value;
    int status;
    const char* param;
  } cases[] = {
      {"model", "other", 404, "model"},       {"model", 3, 400, "model"},
      {"n", 17, 400, "n"},                    {"temperature", "hot", 400, "temperature"},
      {"temperature", 3, 400, "temperature"}, {"top_p", 0, 400, "top_p"},
      {"max_tokens", 0, 400, "max_tokens"},   {"max_completion_tokens", -5, 400, "max_completion_tokens"},
      {"stop", 7, 400, "stop"},               {"stop", {"a", 1}, 400, "stop[1]"},
      {"seed", 1.5, 400, "seed"},             {"top_logprobs", 3, 400, "top_logprobs"},
      {"messages", "hi", 400, "messages"},    {"stream", "yes", 400, "stream"},
      {"reasoning_effort", "max", 400, "reasoning_effort"},
      {"ignore_eos", true, 400, "ignore_eos"},        {"ignore_eos", "yes", 400, "ignore_eos"},
      {"functions", 3, 400, "functions"},
      {"stop_token_ids", {1, -2}, 400, "stop_token_ids[1]"},
      {"stop_token_ids", {300000}, 400, "stop_token_ids[0]"},
      {"min_tokens", -1, 400, "min_tokens"},
      {"chat_template_kwargs", "x", 400, "chat_template_kwargs"},
      {"chat_template_kwargs", {{"reasoning_effort", "max"}}, 400, "chat_template_kwargs.reasoning_effort"},
      {"chat_template_kwargs", {{"conversation_start_date", "2025-13-01"}}, 400,
       "chat_template_kwargs.conversation_start_date"},
      {"modalities", {"text", "audio"}, 400, "modalities[1]"},
      {"audio", {{"voice", "alloy"}, {"format", "mp3"}}, 400, "audio"},
  };
  for (const Case& c : cases) {
    Json body = ok;
    body[c.key] = c.value;
    ApiError e = err(body);
    EXPECT_EQ(e.http_status, c.status) << c.key << " " << e.message;
    EXPECT_EQ(e.param, c.param) << c.key << " " << e.message;
    EXPECT_EQ(ErrorJson(e)["error"]["message"], e.message);
  }
  Json no_model = ok;
  no_model.erase("model");
  EXPECT_EQ(err(no_model).param, "model");
  Json bad_role = ok;
  bad_role["messages"][0]["role"] = "robot";
  EXPECT_EQ(err(bad_role).param, "messages[0].role");
  // The documented no-ops are accepted.
  Json noops = ok;
  noops.update(Json{{"user", "u1"}, {"metadata", {{"k", "v"}}}, {"store", false},
                    {"service_tier", "auto"}, {"parallel_tool_calls", false}, {"ignore_eos", false}});
  EXPECT_TRUE(PrepareChatRequest(noops, "m", Tok(), {}).ok());

  EXPECT_FALSE(ParseBody("{not json").ok());
  EXPECT_FALSE(ParseBody("[1]").ok());
  EXPECT_FALSE(ParseBody("\"\xff\"").ok());
  EXPECT_FALSE(ParseBody(std::string(200000, '[') + std::string(200000, ']')).ok());
  std::string deep = R"({"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": )";
  deep += std::string(5000, '[') + std::string(5000, ']') + "}";
  // Refused while parsing (common/json_parse.h), before anything walks it.
  absl::StatusOr<Json> deep_json = ParseBody(deep);
  ASSERT_FALSE(deep_json.ok());
  EXPECT_EQ(ErrorFromStatus(deep_json.status()).http_status, 400);
  EXPECT_NE(deep_json.status().message().find("nested more than 64 levels"), std::string::npos);
  EXPECT_EQ(ErrorFromStatus(absl::ResourceExhaustedError("busy")).http_status, 429);
  EXPECT_EQ(ErrorFromStatus(absl::UnavailableError("down")).http_status, 503);
  EXPECT_EQ(ErrorFromStatus(absl::DeadlineExceededError("late")).http_status, 504);
  EXPECT_EQ(ErrorFromStatus(absl::InternalError("bug")).http_status, 500);
  // Each code's OpenAI type and code beside its HTTP status.
  const ApiError missing = ErrorFromStatus(absl::NotFoundError("model: no such model"));
  EXPECT_EQ(missing.http_status, 404);
  EXPECT_EQ(missing.type, "invalid_request_error");
  EXPECT_EQ(missing.code, "model_not_found");
  EXPECT_EQ(missing.param, "model");
  const ApiError busy = ErrorFromStatus(absl::ResourceExhaustedError("busy"));
  EXPECT_EQ(busy.type, "rate_limit_error");
  EXPECT_EQ(busy.code, "rate_limit_exceeded");
  EXPECT_EQ(ErrorFromStatus(absl::UnavailableError("down")).type, "service_unavailable_error");
  EXPECT_EQ(ErrorFromStatus(absl::DeadlineExceededError("late")).type, "timeout_error");
  const ApiError bug = ErrorFromStatus(absl::InternalError("bug"));
  EXPECT_EQ(bug.type, "server_error");
  EXPECT_TRUE(bug.code.empty());
}

// The field policy (request_fields.h): every field of OpenAI's chat schema
// and vLLM's extras is accepted with a value a client sends; unknown fields,
// top-level and nested, are ignored and named, or refused by name under
// kRefuse; the acted-on extras change the prompt and the sampling.
TEST(PrepareRequestTest, RequestFieldPolicy) {
  const Json tool = {{"type", "function"},
                     {"function", {{"name", "f"}, {"parameters", {{"type", "object"}}}}}};
  const std::map<std::string, Json> sample = {
      {"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"model", "m"},
      {"audio", nullptr}, {"frequency_penalty", 0.5}, {"function_call", "auto"},
      {"functions", {{{"name", "g"}, {"parameters", {{"type", "object"}}}}}},
      {"logit_bias", {{"13", 1}}}, {"logprobs", true}, {"max_completion_tokens", 40},
      {"max_tokens", 40}, {"metadata", {{"k", "v"}}}, {"modalities", {"text"}},
      {"moderation", {{"enabled", false}}}, {"n", 1}, {"parallel_tool_calls", false},
      {"prediction", {{"type", "content"}, {"content", "x"}}}, {"presence_penalty", 0.1},
      {"prompt_cache_key", "user-42"}, {"prompt_cache_options", Json::object()},
      {"prompt_cache_retention", "24h"}, {"reasoning_effort", "low"},
      {"response_format", {{"type", "text"}}}, {"safety_identifier", "hash-1"}, {"seed", 7},
      {"service_tier", "flex"}, {"stop", "END"}, {"store", true}, {"stream", true},
      {"stream_options", {{"include_usage", true}, {"include_obfuscation", false}}},
      {"temperature", 0.7}, {"tool_choice", "auto"}, {"tools", Json::array({tool})}, {"top_logprobs", 2},
      {"top_p", 0.9}, {"user", "u1"}, {"verbosity", "low"}, {"web_search_options", Json::object()},
      {"top_k", 5}, {"min_p", 0.05}, {"repetition_penalty", 1.1}, {"truncate_prompt_tokens", -1},
      {"ignore_eos", false}, {"cache_salt", "salt"}, {"best_of", 1}, {"stop_token_ids", {13}},
      {"min_tokens", 2}, {"chat_template_kwargs", {{"reasoning_effort", "high"}}}};
  Json all = Json::object(), legacy = Json::object();
  for (const char* field : ChatFields()) {
    ASSERT_TRUE(sample.count(field)) << field << " needs a sample value";
    // functions / function_call and tools / tool_choice are alternatives.
    const bool old_form = std::string(field) == "functions" || std::string(field) == "function_call";
    (old_form ? legacy : all)[field] = sample.at(field);
  }
  legacy["model"] = "m";
  legacy["messages"] = sample.at("messages");
  for (const Json& body : {all, legacy}) {
    absl::StatusOr<PreparedRequest> p = PrepareChatRequest(body, "m", Tok(), {}, 0, UnknownFields::kRefuse);
    ASSERT_TRUE(p.ok()) << p.status() << " " << body.dump();
    EXPECT_TRUE(p->ignored_fields.empty());
  }
  absl::StatusOr<PreparedRequest> acted = PrepareChatRequest(all, "m", Tok(), {});
  ASSERT_TRUE(acted.ok());
  ASSERT_EQ(acted->sampling.stop_token_ids_size(), 3);  // <|return|>, <|call|>, then the request's
  EXPECT_EQ(acted->sampling.stop_token_ids(2), 13);
  EXPECT_EQ(acted->sampling.min_tokens(), 2u);
  // functions became a tool the prompt offers.
  absl::StatusOr<PreparedRequest> old = PrepareChatRequest(legacy, "m", Tok(), {});
  ASSERT_TRUE(old.ok());
  EXPECT_NE(Tok().DecodeUtf8(old->prompt)->find("type g = "), std::string::npos);

  // Unknown fields: ignored and named (nested ones with their path), or refused.
  Json extra = {{"model", "m"},
                {"messages", sample.at("messages")},
                {"guided_json", Json::object()},
                {"stream", true},
                {"stream_options", {{"include_usage", true}, {"continuous_usage_stats", true}}},
                {"chat_template_kwargs", {{"builtin_tools", {"browser"}}}}};
  absl::StatusOr<PreparedRequest> ignored = PrepareChatRequest(extra, "m", Tok(), {});
  ASSERT_TRUE(ignored.ok()) << ignored.status();
  EXPECT_EQ(ignored->ignored_fields,
            (std::vector<std::string>{"guided_json", "stream_options.continuous_usage_stats",
                                      "chat_template_kwargs.builtin_tools"}));
  for (const char* field : {"guided_json", "stream_options", "chat_template_kwargs"}) {
    Json one = {{"model", "m"}, {"messages", sample.at("messages")}, {"stream", true}};
    one[field] = extra[field];
    absl::StatusOr<PreparedRequest> refused =
        PrepareChatRequest(one, "m", Tok(), {}, 0, UnknownFields::kRefuse);
    ASSERT_FALSE(refused.ok()) << field;
    EXPECT_EQ(ErrorFromStatus(refused.status()).http_status, 400);
    EXPECT_EQ(ErrorFromStatus(refused.status()).param.substr(0, std::string(field).size()), field);
  }

  // chat_template_kwargs: what Harmony's system message has a place for.
  Json kwargs = {{"model", "m"},
                 {"messages", sample.at("messages")},
                 {"chat_template_kwargs",
                  {{"reasoning_effort", "high"},
                   {"model_identity", "You are Flotilla's test model."},
                   {"knowledge_cutoff", "2025-01"},
                   {"conversation_start_date", "2026-11-28"}}}};
  absl::StatusOr<PreparedRequest> rendered = PrepareChatRequest(kwargs, "m", Tok(), {});
  ASSERT_TRUE(rendered.ok()) << rendered.status();
  const std::string text = *Tok().DecodeUtf8(rendered->prompt);
  for (const char* part : {"You are Flotilla's test model.", "Knowledge cutoff: 2025-01",
                           "Current date: 2026-11-28", "Reasoning: high"}) {
    EXPECT_NE(text.find(part), std::string::npos) << part << " in " << text;
  }
  // The top-level reasoning_effort wins over the template's.
  kwargs["reasoning_effort"] = "low";
  rendered = PrepareChatRequest(kwargs, "m", Tok(), {});
  ASSERT_TRUE(rendered.ok());
  EXPECT_NE(Tok().DecodeUtf8(rendered->prompt)->find("Reasoning: low"), std::string::npos);

  // The header value is bounded and safe whatever the names.
  EXPECT_EQ(IgnoredFieldsHeaderValue({"a", "b.c"}), "a,b.c");
  EXPECT_EQ(IgnoredFieldsHeaderValue({"x\r\nSet-Cookie: y"}), "x??Set-Cookie??y");
  const std::string many = IgnoredFieldsHeaderValue(std::vector<std::string>(40, std::string(100, 'z')));
  EXPECT_EQ(many, absl::StrJoin(std::vector<std::string>(16, std::string(64, 'z')), ",") + ",...(24 more)");
}

// --reasoning-field: reasoning text under `reasoning`, `reasoning_content`
// or both, in the streamed deltas and the whole message alike.
TEST(ResponsePipelineTest, ReasoningFieldChoosesTheMember) {
  tk::TokenId stop;
  const std::vector<tk::TokenId> ids =
      Completion({Assistant("analysis", "Think."), Assistant("final", "Done.")}, &stop);
  for (ReasoningField field : {ReasoningField::kReasoning, ReasoningField::kReasoningContent,
                               ReasoningField::kBoth}) {
    ResponseBuilder b(&Tok(), Endpoint::kChat, "chatcmpl-r", "m", 1, {}, false);
    b.set_reasoning_field(field);
    std::vector<Json> chunks;
    const Json r = StreamAndMerge(b, ids, stop, &chunks);
    const bool plain = field != ReasoningField::kReasoningContent;
    const bool content = field != ReasoningField::kReasoning;
    const Json& msg = r["choices"][0]["message"];
    EXPECT_EQ(msg.contains("reasoning"), plain);
    EXPECT_EQ(msg.contains("reasoning_content"), content);
    EXPECT_EQ(msg.value("reasoning", ""), plain ? "Think." : "");
    EXPECT_EQ(msg.value("reasoning_content", ""), content ? "Think." : "");
    std::string streamed, streamed_content;
    for (const Json& c : chunks) {
      const Json& d = c["choices"][0]["delta"];
      if (d.contains("reasoning")) streamed += d["reasoning"].get<std::string>();
      if (d.contains("reasoning_content")) streamed_content += d["reasoning_content"].get<std::string>();
    }
    EXPECT_EQ(streamed, plain ? "Think." : "");
    EXPECT_EQ(streamed_content, content ? "Think." : "");
  }
  EXPECT_EQ(*ParseReasoningField("reasoning_content"), ReasoningField::kReasoningContent);
  EXPECT_FALSE(ParseReasoningField("thoughts").ok());
}

TEST(PrepareRequestTest, SamplingAndCompletions) {
  Json body = {{"model", "m"},
               {"messages", {{{"role", "user"}, {"content", "hi"}}}},
               {"temperature", 0},
               {"top_p", 0.5},
               {"seed", 42},
               {"max_completion_tokens", 9},
               {"logprobs", true},
               {"top_logprobs", 2},
               {"stream", true},
               {"stream_options", {{"include_usage", true}}},
               {"stop", "END"}};
  absl::StatusOr<PreparedRequest> p = PrepareChatRequest(body, "m", Tok(), {});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->sampling.temperature(), 0);
  EXPECT_FLOAT_EQ(p->sampling.top_p(), 0.5f);
  EXPECT_EQ(p->sampling.seed(), 42u);
  EXPECT_EQ(p->sampling.max_tokens(), 9u);
  EXPECT_TRUE(p->sampling.return_logprobs());
  EXPECT_EQ(p->sampling.logprobs(), 2u);
  EXPECT_TRUE(p->stream && p->include_usage);
  EXPECT_EQ(p->stop, std::vector<std::string>{"END"});

  absl::StatusOr<PreparedRequest> c =
      PrepareCompletionRequest({{"model", "m"}, {"prompt", "hello world"}}, "m", Tok());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->prompt, (std::vector<tk::TokenId>{24912, 2375}));
  EXPECT_EQ(c->sampling.max_tokens(), 16u);
  EXPECT_FALSE(PrepareCompletionRequest({{"model", "m"}, {"prompt", 5}}, "m", Tok()).ok());

  // Completions text streams through the detokenizer and the stop filter.
  ResponseBuilder b(&Tok(), Endpoint::kCompletions, "cmpl-1", "m", 1, {" world"}, false);
  std::vector<Json> chunks = b.Feed({24912, 2375, 24912}, {});
  EXPECT_TRUE(b.stopped_by_string());
  b.Finish(common::STOP, std::nullopt, 2, 2);
  EXPECT_EQ(b.Response()["choices"][0]["text"], "hello");
  EXPECT_EQ(b.Response()["object"], "text_completion");
}

TEST(PrepareRequestTest, CompletionPromptShapesNAndEcho) {
  auto prepare = [](Json extra) {
    Json body = {{"model", "m"}, {"prompt", "hello world"}};
    body.update(extra);
    return PrepareCompletionRequest(body, "m", Tok());
  };
  auto param = [&](Json extra) {
    absl::StatusOr<PreparedRequest> p = prepare(extra);
    EXPECT_FALSE(p.ok()) << extra.dump();
    return p.ok() ? std::string("(accepted)") : ErrorFromStatus(p.status()).param;
  };
  const std::vector<tk::TokenId> hello{24912, 2375};
  absl::StatusOr<PreparedRequest> ids = prepare({{"prompt", {24912, 2375}}});
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(ids->prompt, hello);
  EXPECT_TRUE(ids->batch.empty());
  EXPECT_EQ(Prompts(*ids).size(), 1u);

  absl::StatusOr<PreparedRequest> batch =
      prepare({{"prompt", Json::array({"hello world", Json::array({24912})})}, {"n", 3}, {"echo", true}});
  ASSERT_TRUE(batch.ok()) << batch.status();
  ASSERT_EQ(batch->batch.size(), 2u);
  EXPECT_EQ(batch->batch[0], hello);
  EXPECT_EQ(batch->batch[1], std::vector<tk::TokenId>{24912});
  EXPECT_EQ(batch->n, 3u);
  EXPECT_TRUE(batch->echo);
  // One string in an array is one prompt, as before.
  absl::StatusOr<PreparedRequest> one = prepare({{"prompt", Json::array({"hello world"})}});
  ASSERT_TRUE(one.ok());
  EXPECT_TRUE(one->batch.empty());
  EXPECT_TRUE(prepare({{"n", 2}, {"best_of", 2}}).ok());

  EXPECT_EQ(param({{"prompt", Json::array({Json::array({1, 2}), Json::array({3, 999999999})})}}),
            "prompt[1][1]");
  EXPECT_EQ(param({{"prompt", {5, -1}}}), "prompt[1]");
  EXPECT_EQ(param({{"prompt", {5, "x"}}}), "prompt[1]");
  EXPECT_EQ(param({{"prompt", Json::array({"ok", 7})}}), "prompt[1]");
  EXPECT_EQ(param({{"prompt", Json::array({"ok", ""})}}), "prompt[1]");
  EXPECT_EQ(param({{"prompt", Json::array({"ok", Json::array()})}}), "prompt[1]");
  EXPECT_EQ(param({{"prompt", Json::array()}}), "prompt");
  EXPECT_EQ(param({{"prompt", std::vector<std::string>(kMaxBatchPrompts + 1, "x")}}), "prompt");
  EXPECT_TRUE(prepare({{"prompt", std::vector<std::string>(kMaxBatchPrompts, "x")}}).ok());
  EXPECT_EQ(param({{"n", 0}}), "n");
  EXPECT_EQ(param({{"n", kMaxChoices + 1}}), "n");
  EXPECT_EQ(param({{"n", 2}, {"best_of", 3}}), "best_of");
  EXPECT_EQ(param({{"echo", true}, {"logprobs", 1}}), "echo");
  // ignore_eos (as vLLM takes it); `user` is a no-op; unknown fields are ignored
  // and named (refused under the strict policy).
  absl::StatusOr<PreparedRequest> eos = prepare({{"ignore_eos", true}, {"user", "u1"}});
  ASSERT_TRUE(eos.ok()) << eos.status();
  EXPECT_TRUE(eos->sampling.ignore_eos());
  EXPECT_TRUE(eos->ignored_fields.empty());
  absl::StatusOr<PreparedRequest> unknown = prepare({{"max_completion_tokens", 5}});
  ASSERT_TRUE(unknown.ok());
  EXPECT_EQ(unknown->ignored_fields, std::vector<std::string>{"max_completion_tokens"});
  absl::StatusOr<PreparedRequest> strict =
      PrepareCompletionRequest(Json{{"model", "m"}, {"prompt", "x"}, {"messages", Json::array()}}, "m",
                               Tok(), 0, UnknownFields::kRefuse);
  ASSERT_FALSE(strict.ok());
  EXPECT_EQ(ErrorFromStatus(strict.status()).param, "messages");
  EXPECT_EQ(param({{"suffix", "tail"}}), "suffix");
  EXPECT_TRUE(prepare({{"suffix", ""}}).ok());
  absl::StatusOr<PreparedRequest> stops = prepare({{"stop_token_ids", {13, 11}}, {"min_tokens", 4}});
  ASSERT_TRUE(stops.ok()) << stops.status();
  ASSERT_EQ(stops->sampling.stop_token_ids_size(), 2);
  EXPECT_EQ(stops->sampling.stop_token_ids(1), 11);
  EXPECT_EQ(stops->sampling.min_tokens(), 4u);
  EXPECT_EQ(param({{"max_tokens", 3}, {"min_tokens", 4}}), "min_tokens");
}

TEST(ResponsePipelineTest, ChoicesOfEventsStreamAndMerge) {
  ResponseBuilder b(&Tok(), Endpoint::kCompletions, "cmpl-n", "m", 1, {}, false, 2);
  auto content = [](uint32_t choice, std::string text) {
    RequestEvent e;
    e.kind = RequestEvent::Kind::kContent;
    e.choice = choice;
    e.text = std::move(text);
    return e;
  };
  auto finish = [](uint32_t choice, const char* reason, uint32_t tokens) {
    RequestEvent e;
    e.kind = RequestEvent::Kind::kFinish;
    e.choice = choice;
    e.finish_reason = reason;
    e.usage = {3, tokens};
    return e;
  };
  std::vector<Json> chunks = b.Consume({content(1, "b"), content(0, "a"), content(1, "c")});
  ASSERT_EQ(chunks.size(), 3u);
  EXPECT_EQ(chunks[0]["choices"][0]["index"], 1);
  EXPECT_EQ(chunks[0]["choices"][0]["text"], "b");
  chunks = b.Consume({finish(0, "stop", 1), finish(1, "length", 2)});
  ASSERT_EQ(chunks.size(), 2u);
  EXPECT_EQ(chunks[1]["choices"][0]["finish_reason"], "length");
  RequestEvent usage;
  usage.kind = RequestEvent::Kind::kUsage;
  usage.usage = {3, 3};
  EXPECT_TRUE(b.Consume({usage}).empty());
  Json r = b.Response();
  ASSERT_EQ(r["choices"].size(), 2u);
  EXPECT_EQ(r["choices"][0]["text"], "a");
  EXPECT_EQ(r["choices"][1]["text"], "bc");
  EXPECT_EQ(r["choices"][1]["index"], 1);
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(r["usage"]["total_tokens"], 6);
  // Chat: the role chunk of every choice first.
  ResponseBuilder chat(&Tok(), Endpoint::kChat, "chatcmpl-n", "m", 1, {}, false, 3);
  std::vector<Json> begin = chat.Begin();
  ASSERT_EQ(begin.size(), 3u);
  EXPECT_EQ(begin[2]["choices"][0]["index"], 2);
  EXPECT_EQ(begin[2]["choices"][0]["delta"]["role"], "assistant");
}

// Tokens that make no text yet (a Harmony header, a held-back stop string)
// keep their logprobs until the next chunk: two such updates in a row lose
// neither's, so a stream carries every token's logprobs as the whole answer.
TEST(ResponsePipelineTest, LogprobsOfTokensWithoutTextAccumulateUntilTheNextChunk) {
  ResponseBuilder b(&Tok(), Endpoint::kChat, "chatcmpl-lp", "m", 1, {}, /*logprobs=*/true);
  std::vector<cluster::SequenceUpdate> updates(2);
  for (int i = 0; i < 2; ++i) {
    common::TokenLogprob* lp = updates[i].add_logprobs();
    lp->set_token_id(100 + i);
    lp->set_logprob(-1.0f - i);
  }
  std::vector<RequestEvent> events;
  for (const cluster::SequenceUpdate& u : updates) {
    RequestEvent tokens;
    tokens.kind = RequestEvent::Kind::kTokens;
    tokens.update = &u;
    events.push_back(tokens);
  }
  RequestEvent text;
  text.kind = RequestEvent::Kind::kContent;
  text.text = "hi";
  events.push_back(text);
  std::vector<Json> chunks = b.Consume(events);
  ASSERT_EQ(chunks.size(), 1u);
  const Json& content = chunks[0]["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 2u) << chunks[0].dump();
  EXPECT_EQ(content[0]["logprob"], -1.0);
  EXPECT_EQ(content[1]["logprob"], -2.0);
}

// A stream's chunks carry every token's logprobs; the builder keeps none
// for a whole answer the stream never asks for (they would add kilobytes a
// token over a long answer with top logprobs), while a whole answer lists
// them all.
TEST(ResponsePipelineTest, AStreamKeepsNoLogprobsForAWholeAnswer) {
  cluster::SequenceUpdate u;
  common::TokenLogprob* lp = u.add_logprobs();
  lp->set_token_id(100);
  lp->set_logprob(-1.5f);
  std::vector<RequestEvent> events(2);
  events[0].kind = RequestEvent::Kind::kTokens;
  events[0].update = &u;
  events[1].kind = RequestEvent::Kind::kContent;
  events[1].text = "hi";
  for (const bool streaming : {true, false}) {
    ResponseBuilder b(&Tok(), Endpoint::kChat, "chatcmpl-s", "m", 1, {}, /*logprobs=*/true);
    b.set_streaming(streaming);
    std::vector<Json> chunks = b.Consume(events);
    ASSERT_EQ(chunks.size(), 1u);
    EXPECT_EQ(chunks[0]["choices"][0]["logprobs"]["content"].size(), 1u) << chunks[0].dump();
    const Json whole = b.Response();
    EXPECT_EQ(whole["choices"][0]["logprobs"]["content"].size(), streaming ? 0u : 1u)
        << whole.dump();
  }
}

}  // namespace
}  // namespace flotilla::coordinator
