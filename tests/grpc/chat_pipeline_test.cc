// The gRPC Chat pipeline without a server: ChatRequest -> the OpenAI body ->
// Harmony prompt, and recorded Harmony completions (rendered with the real
// renderer and tokenizer) -> ChatResponse deltas with reasoning, answer and
// tool-call pieces apart; bad requests are INVALID_ARGUMENT naming the field.
#include "coordinator/grpc/chat_pipeline.h"

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "common/harmony/renderer.h"
#include "coordinator/http/openai_pipeline.h"
#include "tests/harmony_completion.h"

namespace flotilla::coordinator {
namespace {

namespace tk = tokenizer;
using test_support::Assistant, test_support::Completion, test_support::Tok;

// Streams `ids` through a ChatStream `per_update` tokens at a time, the last
// update carrying the finish reason and the stop token.
std::vector<v1::ChatResponse> Stream(ChatStream& s, const std::vector<tk::TokenId>& ids,
                                     std::optional<tk::TokenId> stop, common::FinishReason reason,
                                     size_t per_update = 1) {
  std::vector<v1::ChatResponse> out;
  out.push_back(s.Begin());
  for (size_t i = 0; i < ids.size() && !s.finished(); i += per_update) {
    cluster::SequenceUpdate u;
    u.set_request_id(7);
    for (size_t k = i; k < std::min(ids.size(), i + per_update); ++k)
      u.add_token_ids(static_cast<int32_t>(ids[k]));
    if (std::optional<v1::ChatResponse> r = s.Feed(u)) out.push_back(*r);
  }
  if (!s.finished()) {
    cluster::SequenceUpdate last;
    last.set_request_id(7);
    last.set_finish_reason(reason);
    if (stop) last.set_stop_token(static_cast<int32_t>(*stop));
    last.set_prompt_tokens(30);
    last.set_completion_tokens(static_cast<uint32_t>(ids.size() + (stop ? 1 : 0)));
    if (std::optional<v1::ChatResponse> r = s.Feed(last)) out.push_back(*r);
  }
  return out;
}

struct Merged {
  std::string reasoning, content;
  std::vector<v1::ToolCallDelta> calls;  // merged per index
  int reasoning_deltas = 0, content_deltas = 0;
  v1::ChatResponse::FinishReason finish = v1::ChatResponse::FINISH_REASON_UNSPECIFIED;
  v1::Usage usage;
  int finishes = 0;
};

Merged Merge(const std::vector<v1::ChatResponse>& rs) {
  Merged m;
  for (const v1::ChatResponse& r : rs) {
    EXPECT_EQ(r.request_id(), "7");
    for (const v1::ChatDelta& d : r.deltas()) {
      switch (d.delta_case()) {
        case v1::ChatDelta::kReasoning:
          m.reasoning += d.reasoning();
          ++m.reasoning_deltas;
          break;
        case v1::ChatDelta::kContent:
          m.content += d.content();
          ++m.content_deltas;
          break;
        case v1::ChatDelta::kToolCall: {
          const v1::ToolCallDelta& t = d.tool_call();
          if (t.index() >= m.calls.size()) m.calls.resize(t.index() + 1);
          if (!t.id().empty()) m.calls[t.index()].set_id(t.id());
          if (!t.name().empty()) m.calls[t.index()].set_name(t.name());
          m.calls[t.index()].mutable_arguments()->append(t.arguments());
          break;
        }
        default:
          ADD_FAILURE() << "a delta with no channel";
      }
    }
    if (r.finish_reason() != v1::ChatResponse::FINISH_REASON_UNSPECIFIED) {
      m.finish = r.finish_reason();
      m.usage = r.usage();
      ++m.finishes;
    }
  }
  return m;
}

// Appends a message of `role` (with `content`, when given) to `request`.
v1::ChatMessage* AddMessage(v1::ChatRequest& request, v1::ChatMessage::Role role,
                            const std::string& content = "") {
  v1::ChatMessage* message = request.add_messages();
  message->set_role(role);
  if (!content.empty()) message->set_content(content);
  return message;
}

TEST(ChatStreamTest, ReasoningAndAnswerStreamApart) {
  tk::TokenId stop;
  std::vector<tk::TokenId> ids =
      Completion({Assistant("analysis", "The user asks for a capital. Paris."),
                  Assistant("final", "The capital of France is Paris.")},
                 &stop);
  stop = tk::kReturn;  // the model ends a final answer with <|return|>
  for (size_t per_update : {size_t{1}, size_t{3}, ids.size()}) {
    ChatStream s(&Tok(), "7", "seed", {}, 30);
    std::vector<v1::ChatResponse> rs = Stream(s, ids, stop, common::STOP, per_update);
    // The first message names the request and nothing else.
    ASSERT_GE(rs.size(), 2u);
    EXPECT_EQ(rs[0].request_id(), "7");
    EXPECT_TRUE(rs[0].deltas().empty());
    Merged m = Merge(rs);
    EXPECT_EQ(m.reasoning, "The user asks for a capital. Paris.") << per_update;
    EXPECT_EQ(m.content, "The capital of France is Paris.") << per_update;
    EXPECT_TRUE(m.calls.empty());
    EXPECT_EQ(m.finish, v1::ChatResponse::STOP);
    EXPECT_EQ(m.finishes, 1);
    EXPECT_EQ(m.usage.prompt_tokens(), 30u);
    EXPECT_EQ(m.usage.completion_tokens(), ids.size() + 1);
    if (per_update == 1) {
      // Streamed token by token: several deltas on each channel, and every
      // reasoning delta comes before every answer delta.
      EXPECT_GT(m.reasoning_deltas, 1);
      EXPECT_GT(m.content_deltas, 1);
      bool seen_answer = false;
      for (const v1::ChatResponse& r : rs) {
        for (const v1::ChatDelta& d : r.deltas()) {
          if (d.has_content()) seen_answer = true;
          if (d.has_reasoning()) {
            EXPECT_FALSE(seen_answer) << "reasoning after the answer began";
          }
        }
      }
    }
  }
}

TEST(ChatStreamTest, ToolCallTurnAndFollowUp) {
  tk::TokenId stop;
  std::vector<tk::TokenId> ids =
      Completion({Assistant("analysis", "Need the weather; call the tool."),
                  Assistant("commentary", R"({"location":"Tokyo, JP"})", "functions.get_weather")},
                 &stop);
  ASSERT_EQ(stop, tk::kCall);
  ChatStream s(&Tok(), "7", "seed-1", {}, 30);
  Merged m = Merge(Stream(s, ids, stop, common::STOP));
  EXPECT_EQ(m.finish, v1::ChatResponse::TOOL_CALLS);
  EXPECT_EQ(m.reasoning, "Need the weather; call the tool.");
  EXPECT_EQ(m.content, "");
  ASSERT_EQ(m.calls.size(), 1u);
  EXPECT_EQ(m.calls[0].name(), "get_weather");
  EXPECT_EQ(m.calls[0].arguments(), R"({"location":"Tokyo, JP"})");
  EXPECT_EQ(m.calls[0].id(), harmony::ToolCallId("seed-1", 0, "get_weather"));

  // The follow-up turn: the call and its result, rendered the same way the
  // OpenAI body of the same conversation renders.
  v1::ChatRequest req;
  AddMessage(req, v1::ChatMessage::USER, "Weather in Tokyo?");
  auto* a = AddMessage(req, v1::ChatMessage::ASSISTANT);
  a->set_reasoning(m.reasoning);
  auto* call = a->add_tool_calls();
  call->set_id(m.calls[0].id());
  call->set_name("get_weather");
  call->set_arguments(m.calls[0].arguments());
  auto* t = AddMessage(req, v1::ChatMessage::TOOL);
  t->set_tool_call_id(m.calls[0].id());
  t->set_name("get_weather");
  t->set_content(R"({"temp_c": 21})");
  auto* tool = req.add_tools();
  tool->set_name("get_weather");
  tool->set_description("Gets the weather");
  tool->set_parameters_json(
      R"({"type": "object", "properties": {"location": {"type": "string"}}})");
  req.set_reasoning_effort(v1::LOW);
  absl::StatusOr<PreparedRequest> p = PrepareChat(req, "m", Tok(), {});
  ASSERT_TRUE(p.ok()) << p.status();
  const std::string text = *Tok().DecodeUtf8(p->prompt);
  EXPECT_NE(text.find("Reasoning: low"), std::string::npos) << text;
  EXPECT_NE(text.find("type get_weather = (_: {\n"), std::string::npos) << text;
  test_support::ExpectWeatherRoundTrip(text, R"({"location":"Tokyo, JP"})");

  Json body = {
      {"model", "m"},
      {"reasoning_effort", "low"},
      {"messages",
       {{{"role", "user"}, {"content", "Weather in Tokyo?"}},
        {{"role", "assistant"},
         {"content", nullptr},
         {"reasoning_content", m.reasoning},
         {"tool_calls",
          {{{"id", m.calls[0].id()},
            {"type", "function"},
            {"function", {{"name", "get_weather"}, {"arguments", m.calls[0].arguments()}}}}}}},
        {{"role", "tool"}, {"tool_call_id", m.calls[0].id()}, {"content", R"({"temp_c": 21})"}}}},
      {"tools", Json::array({test_support::WeatherTool({{"location", {{"type", "string"}}}})})}};
  absl::StatusOr<PreparedRequest> q = PrepareChatRequest(body, "m", Tok(), {});
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(p->prompt, q->prompt);
  test_support::ExpectHarmonyStops(p->sampling);
}

// max_tokens that end the call mid-arguments: LENGTH, not TOOL_CALLS.
TEST(ChatStreamTest, ToolCallCutByTheLengthLimitIsLength) {
  tk::TokenId stop;
  const std::vector<tk::TokenId> ids = Completion(
      {Assistant("commentary", R"({"location":"Tokyo, JP"})", "functions.get_weather")}, &stop);
  const std::vector<tk::TokenId> head(ids.begin(), ids.end() - 3);
  ChatStream s(&Tok(), "7", "seed-1", {}, 30);
  EXPECT_EQ(Merge(Stream(s, head, std::nullopt, common::LENGTH)).finish, v1::ChatResponse::LENGTH);
}

TEST(ChatStreamTest, StopStringLengthAndCancel) {
  tk::TokenId stop;
  std::vector<tk::TokenId> ids = Completion(
      {Assistant("analysis", "Count."), Assistant("final", "One, two, three. Four.")}, &stop);
  {
    ChatStream s(&Tok(), "7", "x", {"three."}, 30);
    Merged m = Merge(Stream(s, ids, tk::kReturn, common::STOP));
    EXPECT_TRUE(s.stopped_by_string());
    EXPECT_EQ(m.content, "One, two, ");
    EXPECT_EQ(m.reasoning, "Count.");
    EXPECT_EQ(m.finish, v1::ChatResponse::STOP);
    EXPECT_EQ(m.finishes, 1);
    EXPECT_LT(m.usage.completion_tokens(), ids.size());
  }
  {
    ChatStream s(&Tok(), "7", "x", {}, 30);
    std::vector<tk::TokenId> cut(ids.begin(), ids.end() - 2);
    Merged m = Merge(Stream(s, cut, std::nullopt, common::LENGTH));
    EXPECT_EQ(m.finish, v1::ChatResponse::LENGTH);
    EXPECT_EQ(m.usage.completion_tokens(), cut.size());
  }
  {
    ChatStream s(&Tok(), "7", "x", {}, 30);
    cluster::SequenceUpdate u;
    u.set_request_id(7);
    for (size_t i = 0; i < 5; ++i) u.add_token_ids(static_cast<int32_t>(ids[i]));
    s.Feed(u);
    v1::ChatResponse c = s.Cancelled();
    EXPECT_EQ(c.finish_reason(), v1::ChatResponse::CANCELLED);
    EXPECT_EQ(c.usage().completion_tokens(), 5u);
    EXPECT_EQ(c.usage().prompt_tokens(), 30u);
    EXPECT_TRUE(s.finished());
    // An error update (the request failed) produces nothing.
    cluster::SequenceUpdate e;
    e.set_finish_reason(common::ERROR);
    EXPECT_FALSE(s.Feed(e).has_value());
  }
}

TEST(ChatStreamTest, RawTokensOnRequest) {
  tk::TokenId stop;
  std::vector<tk::TokenId> ids = Completion({Assistant("final", "Paris.")}, &stop);
  ChatStream s(&Tok(), "7", "x", {}, 30, /*return_token_ids=*/true);
  std::vector<v1::ChatResponse> rs = Stream(s, ids, tk::kReturn, common::STOP);
  std::vector<tk::TokenId> raw;
  for (const v1::ChatResponse& r : rs)
    raw.insert(raw.end(), r.token_ids().begin(), r.token_ids().end());
  std::vector<tk::TokenId> want = ids;
  want.push_back(tk::kReturn);
  EXPECT_EQ(raw, want);
  // One message per update: header tokens too, though they show no text.
  EXPECT_EQ(rs.size(), ids.size() + 2);
  EXPECT_EQ(Merge(rs).content, "Paris.");
}

TEST(ChatRequestTest, SamplingAndOptionsMapToThePrompt) {
  v1::ChatRequest req;
  AddMessage(req, v1::ChatMessage::SYSTEM, "Be terse.");
  AddMessage(req, v1::ChatMessage::USER, "Hi");
  common::SamplingParams* s = req.mutable_sampling();
  s->set_temperature(0);
  s->set_top_p(0.5f);
  s->set_top_k(40);
  s->set_min_p(0.05f);
  s->set_seed(42);
  s->set_max_tokens(9);
  s->set_logprobs(2);
  s->add_stop_token_ids(5);
  req.add_stop("END");
  absl::StatusOr<PreparedRequest> p = PrepareChat(req, "m", Tok(), {});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->sampling.temperature(), 0);
  EXPECT_FLOAT_EQ(p->sampling.top_p(), 0.5f);
  EXPECT_EQ(p->sampling.top_k(), 40);
  EXPECT_FLOAT_EQ(p->sampling.min_p(), 0.05f);
  EXPECT_EQ(p->sampling.seed(), 42u);
  EXPECT_EQ(p->sampling.max_tokens(), 9u);
  EXPECT_TRUE(p->sampling.return_logprobs());
  EXPECT_EQ(p->sampling.logprobs(), 2u);
  EXPECT_EQ(p->sampling.stop_token_ids_size(), 3);
  EXPECT_EQ(p->stop, std::vector<std::string>{"END"});
  const std::string text = *Tok().DecodeUtf8(p->prompt);
  EXPECT_NE(text.find("<|start|>developer<|message|># Instructions\n\nBe terse."),
            std::string::npos)
      << text;
  EXPECT_TRUE(text.ends_with("<|start|>user<|message|>Hi<|end|><|start|>assistant")) << text;

  // tool_choice NONE leaves the tools out; FUNCTION keeps only that one.
  auto* tool = req.add_tools();
  tool->set_name("lookup");
  req.add_tools()->set_name("other");
  req.mutable_tool_choice()->set_mode(v1::ToolChoice::NONE);
  p = PrepareChat(req, "m", Tok(), {});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(Tok().DecodeUtf8(p->prompt)->find("lookup"), std::string::npos);
  req.mutable_tool_choice()->set_mode(v1::ToolChoice::FUNCTION);
  req.mutable_tool_choice()->set_function("other");
  p = PrepareChat(req, "m", Tok(), {});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(Tok().DecodeUtf8(p->prompt)->find("type lookup"), std::string::npos);
  EXPECT_NE(Tok().DecodeUtf8(p->prompt)->find("type other"), std::string::npos);
}

// response_format and strict tools become the same constraint as the HTTP
// body's response_format and `strict: true`.
TEST(ChatRequestTest, ResponseFormatAndStrictToolsBecomeTheConstraint) {
  v1::ChatRequest r;
  AddMessage(r, v1::ChatMessage::USER, "Hi");
  absl::StatusOr<PreparedRequest> p = PrepareChat(r, "m", Tok(), {});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_FALSE(p->constraint.has_value());

  r.mutable_response_format()->set_type(v1::ResponseFormat::TEXT);
  p = PrepareChat(r, "m", Tok(), {});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_FALSE(p->constraint.has_value());

  r.mutable_response_format()->set_type(v1::ResponseFormat::JSON_OBJECT);
  p = PrepareChat(r, "m", Tok(), {});
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_TRUE(p->constraint.has_value());
  EXPECT_TRUE(p->constraint->json_final);
  EXPECT_TRUE(p->constraint->final_schema.empty());

  const std::string schema = R"({"type":"object","properties":{"a":{"type":"integer"}}})";
  r.mutable_response_format()->set_type(v1::ResponseFormat::JSON_SCHEMA);
  r.mutable_response_format()->mutable_json_schema()->set_schema_json(schema);
  r.mutable_sampling()->set_max_tokens(100);
  p = PrepareChat(r, "m", Tok(), {});
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_TRUE(p->constraint.has_value());
  EXPECT_TRUE(p->constraint->json_final);
  EXPECT_EQ(nlohmann::json::parse(p->constraint->final_schema), nlohmann::json::parse(schema));
  EXPECT_EQ(p->constraint->reasoning_budget, 50);
  EXPECT_TRUE(p->constraint->tools.empty());

  r.clear_response_format();
  // A tool that is not strict is only described to the model: a schema
  // feature the matcher cannot enforce is no reason to refuse it.
  v1::ChatRequest described = r;
  auto* loose = described.add_tools();
  loose->set_name("when");
  loose->set_parameters_json(R"({"type":"object","properties":{"d":{"type":"string","format":"iri"}}})");
  p = PrepareChat(described, "m", Tok(), {});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_FALSE(p->constraint.has_value());

  auto* t = r.add_tools();
  t->set_name("f");
  t->set_parameters_json(schema);
  p = PrepareChat(r, "m", Tok(), {});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_FALSE(p->constraint.has_value()) << "a tool that is not strict is free under AUTO";
  t->set_strict(true);
  p = PrepareChat(r, "m", Tok(), {});
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_TRUE(p->constraint.has_value());
  ASSERT_EQ(p->constraint->tools.size(), 1u);
  EXPECT_EQ(p->constraint->tools[0].name, "f");
  EXPECT_TRUE(p->constraint->tools[0].constrained);
  EXPECT_FALSE(p->constraint->tool_required);
}

TEST(ChatRequestTest, BadInputIsInvalidArgumentNamingTheField) {
  auto base = [] {
    v1::ChatRequest r;
    AddMessage(r, v1::ChatMessage::USER, "Hi");
    return r;
  };
  // The edit that asks for a response format of `type` with `schema` (null: none).
  auto format = [](v1::ResponseFormat::Type type, const char* schema) {
    return [type, schema](v1::ChatRequest& r) {
      r.mutable_response_format()->set_type(type);
      if (schema != nullptr) {
        r.mutable_response_format()->mutable_json_schema()->set_schema_json(schema);
      }
    };
  };
  struct Case {
    std::function<void(v1::ChatRequest&)> edit;
    absl::StatusCode code;
    std::string field;  // the message starts with "field: "
  } cases[] = {
      {[](v1::ChatRequest& r) { r.clear_messages(); }, absl::StatusCode::kInvalidArgument,
       "messages"},
      {[](v1::ChatRequest& r) {
         r.mutable_messages(0)->set_role(v1::ChatMessage::ROLE_UNSPECIFIED);
       },
       absl::StatusCode::kInvalidArgument, "messages[0].role"},
      {[](v1::ChatRequest& r) { r.mutable_messages(0)->set_reasoning("x"); },
       absl::StatusCode::kInvalidArgument, "messages[0].reasoning"},
      {[](v1::ChatRequest& r) { r.mutable_messages(0)->set_tool_call_id("c"); },
       absl::StatusCode::kInvalidArgument, "messages[0].tool_call_id"},
      {[](v1::ChatRequest& r) { AddMessage(r, v1::ChatMessage::TOOL, "42"); },
       absl::StatusCode::kInvalidArgument, "messages[1].tool_call_id"},
      {[](v1::ChatRequest& r) {
         auto* t = AddMessage(r, v1::ChatMessage::TOOL);
         t->set_tool_call_id("call_nope");
       },
       absl::StatusCode::kInvalidArgument, "messages[1].tool_call_id"},
      {[](v1::ChatRequest& r) {
         auto* a = AddMessage(r, v1::ChatMessage::ASSISTANT);
         auto* c = a->add_tool_calls();
         c->set_id("call_1");
         c->set_name("f");
         auto* t = AddMessage(r, v1::ChatMessage::TOOL);
         t->set_tool_call_id("call_1");
         t->set_name("g");
       },
       absl::StatusCode::kInvalidArgument, "messages[2].name"},
      {[](v1::ChatRequest& r) { r.add_tools()->set_name(""); }, absl::StatusCode::kInvalidArgument,
       "tools[0].name"},
      {[](v1::ChatRequest& r) { r.add_tools()->set_name("bad name"); },
       absl::StatusCode::kInvalidArgument, "tools[0].name"},
      {[](v1::ChatRequest& r) {
         r.add_tools()->set_name("f");
         r.add_tools()->set_name("f");
       },
       absl::StatusCode::kInvalidArgument, "tools[1].name"},
      {[](v1::ChatRequest& r) {
         r.add_tools()->set_name("f");
         r.mutable_tool_choice()->set_mode(v1::ToolChoice::FUNCTION);
         r.mutable_tool_choice()->set_function("g");
       },
       absl::StatusCode::kInvalidArgument, "tool_choice.function"},
      {[](v1::ChatRequest& r) {
         auto* t = r.add_tools();
         t->set_name("f");
         t->set_parameters_json("[1]");
       },
       absl::StatusCode::kInvalidArgument, "tools[0].parameters_json"},
      {[](v1::ChatRequest& r) {
         auto* a = AddMessage(r, v1::ChatMessage::ASSISTANT);
         a->add_tool_calls()->set_id("call_1");
       },
       absl::StatusCode::kInvalidArgument, "messages[1].tool_calls[0].name"},
      {[](v1::ChatRequest& r) {
         auto* a = AddMessage(r, v1::ChatMessage::ASSISTANT);
         a->add_tool_calls()->set_name("f");
       },
       absl::StatusCode::kInvalidArgument, "messages[1].tool_calls[0].id"},
      {[](v1::ChatRequest& r) { AddMessage(r, v1::ChatMessage::USER)->set_name("x"); },
       absl::StatusCode::kInvalidArgument, "messages[1].name"},
      {[](v1::ChatRequest& r) {
         auto* t = r.add_tools();
         t->set_name("f");
         t->set_parameters_json("{not json");
       },
       absl::StatusCode::kInvalidArgument, "tools[0].parameters_json"},
      {[](v1::ChatRequest& r) { r.mutable_tool_choice()->set_mode(v1::ToolChoice::REQUIRED); },
       absl::StatusCode::kInvalidArgument, "tool_choice"},
      {[](v1::ChatRequest& r) { r.mutable_tool_choice()->set_mode(v1::ToolChoice::FUNCTION); },
       absl::StatusCode::kInvalidArgument, "tool_choice.function"},
      {[](v1::ChatRequest& r) { r.mutable_tool_choice()->set_function("f"); },
       absl::StatusCode::kInvalidArgument, "tool_choice.function"},
      {[](v1::ChatRequest& r) { r.set_reasoning_effort(static_cast<v1::ReasoningEffort>(9)); },
       absl::StatusCode::kInvalidArgument, "reasoning_effort"},
      {[](v1::ChatRequest& r) { r.mutable_sampling()->set_temperature(3); },
       absl::StatusCode::kInvalidArgument, "sampling.temperature"},
      {[](v1::ChatRequest& r) { r.mutable_sampling()->set_top_p(0); },
       absl::StatusCode::kInvalidArgument, "sampling.top_p"},
      {[](v1::ChatRequest& r) { r.mutable_sampling()->set_top_k(-1); },
       absl::StatusCode::kInvalidArgument, "sampling.top_k"},
      {[](v1::ChatRequest& r) { r.mutable_sampling()->set_logprobs(21); },
       absl::StatusCode::kInvalidArgument, "sampling.logprobs"},
      {[](v1::ChatRequest& r) { (*r.mutable_sampling()->mutable_logit_bias())[7] = 101; },
       absl::StatusCode::kInvalidArgument, "sampling.logit_bias[7]"},
      {[](v1::ChatRequest& r) { (*r.mutable_sampling()->mutable_logit_bias())[-2] = 1; },
       absl::StatusCode::kInvalidArgument, "sampling.logit_bias[-2]"},
      {[](v1::ChatRequest& r) { r.mutable_sampling()->set_truncate_prompt_tokens(0); },
       absl::StatusCode::kInvalidArgument, "sampling.truncate_prompt_tokens"},
      {[](v1::ChatRequest& r) {
         r.mutable_sampling()->set_max_tokens(4);
         r.mutable_sampling()->set_min_tokens(5);
       },
       absl::StatusCode::kInvalidArgument, "sampling.min_tokens"},
      {[](v1::ChatRequest& r) { r.mutable_sampling()->set_repetition_penalty(0); },
       absl::StatusCode::kInvalidArgument, "sampling.repetition_penalty"},
      {[](v1::ChatRequest& r) { r.set_n(17); }, absl::StatusCode::kInvalidArgument, "n"},
      {[](v1::ChatRequest& r) { r.mutable_sampling()->set_ignore_eos(true); },
       absl::StatusCode::kInvalidArgument, "sampling.ignore_eos"},
      {[](v1::ChatRequest& r) { r.mutable_sampling()->add_stop_token_ids(-3); },
       absl::StatusCode::kInvalidArgument, "sampling.stop_token_ids[0]"},
      {[](v1::ChatRequest& r) { r.add_stop()->clear(); }, absl::StatusCode::kInvalidArgument,
       "stop"},
      {[](v1::ChatRequest& r) {
         for (int i = 0; i < 5; ++i) *r.add_stop() = std::string(1, static_cast<char>('a' + i));
       },
       absl::StatusCode::kInvalidArgument, "stop"},
      {[](v1::ChatRequest& r) { r.set_model("other-model"); }, absl::StatusCode::kNotFound,
       "model"},
      {format(v1::ResponseFormat::JSON_SCHEMA, nullptr), absl::StatusCode::kInvalidArgument,
       "response_format.json_schema.schema_json"},
      {format(v1::ResponseFormat::JSON_SCHEMA, "[1]"), absl::StatusCode::kInvalidArgument,
       "response_format.json_schema.schema_json"},
      {format(v1::ResponseFormat::JSON_SCHEMA,
              R"({"type": "string", "pattern": "(a)\\1"})"),  // a backreference
       absl::StatusCode::kInvalidArgument, "response_format.json_schema.schema_json"},
      {format(v1::ResponseFormat::JSON_OBJECT, "{}"), absl::StatusCode::kInvalidArgument,
       "response_format.json_schema"},
      {format(static_cast<v1::ResponseFormat::Type>(7), nullptr),
       absl::StatusCode::kInvalidArgument, "response_format.type"},
      {[](v1::ChatRequest& r) {
         auto* t = r.add_tools();
         t->set_name("f");
         t->set_strict(true);
         t->set_parameters_json(R"({"type": "object", "properties": {"d": {"format": "iri"}}})");
       },
       absl::StatusCode::kInvalidArgument, "tools[0].parameters_json"},
  };
  for (size_t i = 0; i < std::size(cases); ++i) {
    v1::ChatRequest r = base();
    cases[i].edit(r);
    absl::StatusOr<PreparedRequest> p = PrepareChat(r, "m", Tok(), {});
    ASSERT_FALSE(p.ok()) << "case " << i << ": " << r.DebugString();
    EXPECT_EQ(p.status().code(), cases[i].code) << "case " << i << ": " << p.status();
    EXPECT_TRUE(absl::StartsWith(p.status().message(), cases[i].field + ": "))
        << "case " << i << ": want field " << cases[i].field << ", got: " << p.status().message();
    // The proto's names, never the OpenAI body's.
    EXPECT_FALSE(absl::StrContains(p.status().message(), "function.name")) << p.status();
    EXPECT_FALSE(absl::StrContains(p.status().message(), ".schema:")) << p.status();
    EXPECT_FALSE(absl::StrContains(p.status().message(), ".parameters:")) << p.status();
  }
  EXPECT_TRUE(PrepareChat(base(), "m", Tok(), {}).ok());
}

}  // namespace
}  // namespace flotilla::coordinator
