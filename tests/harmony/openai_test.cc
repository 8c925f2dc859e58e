#include "common/harmony/openai.h"

#include <gtest/gtest.h>

#include "common/harmony/renderer.h"

namespace flotilla::harmony {
namespace {

using Json = nlohmann::ordered_json;
namespace tk = tokenizer;

OpenAiRequestOptions Opts() {
  OpenAiRequestOptions o;
  o.date = "2025-06-28";
  return o;
}

std::string RenderRequest(const std::string& body) {
  auto mapped = MapChatRequestBody(body, Opts());
  EXPECT_TRUE(mapped.ok()) << mapped.status();
  if (!mapped.ok()) return "";
  auto r = RenderForCompletion(mapped->conversation, {});
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? r->Text() : "";
}

TEST(OpenAiRequest, FullConversationWithToolCalls) {
  const std::string text = RenderRequest(R"({
    "model": "gpt-oss-120b",
    "reasoning_effort": "high",
    "messages": [
      {"role": "system", "content": "Be brief."},
      {"role": "user", "content": "Hi"},
      {"role": "assistant", "reasoning_content": "Greet.", "content": "Hello!"},
      {"role": "user", "content": [{"type": "text", "text": "Weather in "}, {"type": "text", "text": "Oslo?"}]},
      {"role": "assistant", "reasoning_content": "Need the tool.",
       "tool_calls": [{"id": "call_1", "type": "function",
                       "function": {"name": "get_weather", "arguments": "{\"city\":\"Oslo\"}"}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\":3}"}
    ],
    "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Current weather.",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
  })");
  EXPECT_EQ(text,
            "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
            "Knowledge cutoff: 2024-06\nCurrent date: 2025-06-28\n\nReasoning: high\n\n"
            "# Valid channels: analysis, commentary, final. Channel must be included for every message.\n"
            "Calls to these tools must go to the commentary channel: 'functions'.<|end|>"
            "<|start|>developer<|message|># Instructions\n\nBe brief.\n\n# Tools\n\n## functions\n\n"
            "namespace functions {\n\n// Current weather.\ntype get_weather = (_: {\ncity: string,\n}) => any;\n\n"
            "} // namespace functions<|end|>"
            "<|start|>user<|message|>Hi<|end|>"
            // the first turn's reasoning is dropped: a final answer followed it
            "<|start|>assistant<|channel|>final<|message|>Hello!<|end|>"
            "<|start|>user<|message|>Weather in Oslo?<|end|>"
            "<|start|>assistant<|channel|>analysis<|message|>Need the tool.<|end|>"
            "<|start|>assistant to=functions.get_weather<|channel|>commentary <|constrain|>json<|message|>"
            "{\"city\":\"Oslo\"}<|call|>"
            "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>{\"temp\":3}<|end|>"
            "<|start|>assistant");
}

TEST(OpenAiRequest, ToolChoice) {
  const std::string tools = R"("tools": [
      {"type": "function", "function": {"name": "a"}},
      {"type": "function", "function": {"name": "b"}}])";
  auto none = RenderRequest(R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": "none", )" + tools + "}");
  EXPECT_EQ(none.find("namespace functions"), std::string::npos);
  EXPECT_EQ(none.find("Calls to these tools"), std::string::npos);
  auto named = RenderRequest(
      R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": {"type": "function", "function": {"name": "b"}}, )" +
      tools + "}");
  EXPECT_EQ(named.find("type a ="), std::string::npos);
  EXPECT_NE(named.find("type b ="), std::string::npos);
  EXPECT_NE(named.find("You must call the function `functions.b`"), std::string::npos);
  auto required = RenderRequest(R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required", )" + tools + "}");
  EXPECT_NE(required.find("You must call one of the functions"), std::string::npos);
  auto unknown = MapChatRequestBody(
      R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": {"type": "function", "function": {"name": "zz"}}, )" +
          tools + "}",
      Opts());
  EXPECT_FALSE(unknown.ok());
}

TEST(OpenAiRequest, BadRequestsAreClearErrors) {
  struct Bad {
    std::string body;
    const char* expect;
  } cases[] = {
      {R"({"messages": [{"role": "wizard", "content": "x"}]})", "messages[0].role: unknown role 'wizard'"},
      {R"({"messages": []})", "messages"},
      {R"({"messages": [{"role": "tool", "tool_call_id": "nope", "content": "x"}]})", "'nope' matches no earlier"},
      {R"({"messages": [{"role": "tool", "content": "x"}]})", "tool_call_id: is required"},
      {R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})", "'image_url' is not supported"},
      {R"({"messages": [{"role": "user", "content": "x"}], "reasoning_effort": "max"})", "reasoning_effort"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "strng"}}}}}]})",
       "tools[0]: malformed tool schema"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "bad name"}}]})",
       "tools[0].function.name"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": "sometimes"})", "tool_choice"},
      {R"({"messages": [{"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "f"}}]}]})",
       "tool_calls[0].id"},
      {"{\"messages\": [{\"role\": \"user\", \"content\": \"caf\xC3\"}]}", "not valid UTF-8"},
      {"{\"messages\": [", "not valid JSON"},
      {"[1, 2]", "JSON object"},
  };
  for (const auto& c : cases) {
    auto r = MapChatRequestBody(c.body, Opts());
    ASSERT_FALSE(r.ok()) << c.body;
    EXPECT_NE(std::string(r.status().message()).find(c.expect), std::string::npos) << c.body << " -> " << r.status();
  }
  // Invalid UTF-8 in a request built in code (not parsed from text).
  Json j = {{"messages", {{{"role", "user"}, {"content", std::string("\xFF")}}}}};
  auto r = MapChatRequest(j, Opts());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(std::string(r.status().message()).find("UTF-8"), std::string::npos) << r.status();
  OpenAiRequestOptions bad_date;
  bad_date.date = "2025-02-30";
  EXPECT_FALSE(MapChatRequestBody(R"({"messages": [{"role": "user", "content": "x"}]})", bad_date).ok());
}

// The typed conversation, as a parser of another API fills it: the mapping's
// errors name the fields that parser gave, and the JSON parser's conversation
// maps to the same prompt as the typed one.
TEST(OpenAiRequest, TypedConversationErrorsNameItsFields) {
  ChatConversation c;
  ChatMessage user;
  user.content = "Weather?";
  user.field = "messages[0]";
  c.messages.push_back(user);
  ChatTool tool;
  tool.name = "get_weather";
  tool.field = "tools[0]";
  tool.parameters_field = "tools[0].parameters_json";
  c.tools.push_back(tool);
  absl::StatusOr<MappedRequest> ok = MapChatRequest(c, Opts());
  ASSERT_TRUE(ok.ok()) << ok.status();
  absl::StatusOr<MappedRequest> from_json =
      MapChatRequest(Json::parse(R"({"messages": [{"role": "user", "content": "Weather?"}],
                      "tools": [{"type": "function", "function": {"name": "get_weather"}}]})"),
                     Opts());
  ASSERT_TRUE(from_json.ok()) << from_json.status();
  EXPECT_EQ(RenderForCompletion(ok->conversation, RenderOptions())->Text(),
            RenderForCompletion(from_json->conversation, RenderOptions())->Text());

  auto error = [&](ChatConversation bad) {
    absl::StatusOr<MappedRequest> r = MapChatRequest(bad, Opts());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    return std::string(r.status().message());
  };
  ChatConversation dup = c;
  dup.tools.push_back(tool);
  dup.tools[1].field = "tools[1]";
  EXPECT_EQ(error(dup).rfind("tools[1].name: duplicate tool", 0), 0u) << error(dup);
  ChatConversation choice = c;
  choice.tool_choice.mode = ChatToolChoice::Mode::kFunction;
  choice.tool_choice.function = "nope";
  choice.tool_choice.function_field = "tool_choice.function";
  EXPECT_EQ(error(choice).rfind("tool_choice.function: 'nope'", 0), 0u) << error(choice);
  ChatConversation result = c;
  ChatMessage tool_result;
  tool_result.role = ChatRole::kTool;
  tool_result.tool_call_id = "call_9";
  tool_result.field = "messages[1]";
  result.messages.push_back(tool_result);
  EXPECT_EQ(error(result).rfind("messages[1].tool_call_id: 'call_9' matches no", 0), 0u)
      << error(result);
  ChatConversation wrong_name = c;
  ChatMessage call;
  call.role = ChatRole::kAssistant;
  call.tool_calls.push_back({"call_1", "get_weather", "{}", /*field=*/""});
  call.field = "messages[1]";
  wrong_name.messages.push_back(call);
  tool_result.tool_call_id = "call_1";
  tool_result.name = "other";
  tool_result.field = "messages[2]";
  wrong_name.messages.push_back(tool_result);
  EXPECT_EQ(error(wrong_name).rfind("messages[2].name: 'other' but call 'call_1'", 0), 0u)
      << error(wrong_name);
}

TEST(OpenAiReply, FinalReasoningAndToolCalls) {
  std::vector<Message> msgs(4);
  msgs[0].role = msgs[1].role = msgs[2].role = msgs[3].role = Role::kAssistant;
  msgs[0].channel = "analysis";
  msgs[0].content = "Think.";
  msgs[1].channel = "commentary";
  msgs[1].recipient = "functions.get_weather";
  msgs[1].content = R"({"city":"Oslo"})";
  msgs[2].channel = "commentary";
  msgs[2].recipient = "functions.get_time";
  msgs[2].content = "{}";
  msgs[3].channel = "analysis";
  msgs[3].content = " More.";
  ChatReply r = MapReply(msgs, tk::kCall, "req-1");
  EXPECT_EQ(r.finish_reason, "tool_calls");
  EXPECT_TRUE(r.message["content"].is_null());
  EXPECT_EQ(r.message["reasoning_content"], "Think. More.");
  ASSERT_EQ(r.message["tool_calls"].size(), 2u);
  EXPECT_EQ(r.message["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(r.message["tool_calls"][0]["function"]["arguments"], R"({"city":"Oslo"})");
  EXPECT_EQ(r.message["tool_calls"][1]["function"]["name"], "get_time");
  // Ids: stable for the same seed, distinct across calls and seeds.
  const std::string id0 = r.message["tool_calls"][0]["id"];
  EXPECT_EQ(id0, MapReply(msgs, tk::kCall, "req-1").message["tool_calls"][0]["id"]);
  EXPECT_NE(id0, r.message["tool_calls"][1]["id"]);
  EXPECT_NE(id0, MapReply(msgs, tk::kCall, "req-2").message["tool_calls"][0]["id"]);
  EXPECT_EQ(id0.rfind("call_", 0), 0u);

  std::vector<Message> answer(1);
  answer[0].role = Role::kAssistant;
  answer[0].channel = "final";
  answer[0].content = "4";
  ChatReply a = MapReply(answer, tk::kReturn, "x");
  EXPECT_EQ(a.message["content"], "4");
  EXPECT_FALSE(a.message.contains("tool_calls"));
  EXPECT_EQ(a.finish_reason, "stop");
  EXPECT_EQ(MapReply(answer, std::nullopt, "x").finish_reason, "length");
}

TEST(OpenAiReply, StreamingDeltasMatchTheWholeReply) {
  auto tok = tk::Tokenizer::Create(tk::Tokenizer::DefaultRanksPath());
  ASSERT_TRUE(tok.ok()) << tok.status();
  auto ids = (*tok)->Encode(
      "<|channel|>analysis<|message|>Need weather.<|end|>"
      "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
      "{\"city\": \"Oslo\"}<|call|>",
      tk::SpecialTokenPolicy::All());
  ASSERT_TRUE(ids.ok());
  StreamParser parser(tok->get(), {Role::kAssistant, true});
  ChatDeltaMapper mapper("req-9");
  std::string reasoning, args, id, name;
  for (auto t : *ids) {
    auto ev = parser.Process(t);
    ASSERT_TRUE(ev.ok()) << ev.status();
    for (const Json& d : mapper.OnEvent(parser, *ev)) {
      if (d.contains("reasoning_content")) reasoning += d["reasoning_content"].get<std::string>();
      if (d.contains("tool_calls")) {
        const Json& c = d["tool_calls"][0];
        EXPECT_EQ(c["index"], 0);
        if (c.contains("id")) id = c["id"];
        if (c["function"].contains("name")) name = c["function"]["name"];
        args += c["function"]["arguments"].get<std::string>();
      }
      EXPECT_FALSE(d.contains("content")) << d.dump();
    }
  }
  ASSERT_TRUE(parser.Finish().ok());
  ChatReply whole = MapReply(parser.messages(), parser.end_tokens().back(), "req-9");
  EXPECT_EQ(reasoning, whole.message["reasoning_content"]);
  EXPECT_EQ(name, "get_weather");
  EXPECT_EQ(args, whole.message["tool_calls"][0]["function"]["arguments"]);
  EXPECT_EQ(id, whole.message["tool_calls"][0]["id"]);
}

}  // namespace
}  // namespace flotilla::harmony
