// POST /v1/responses without HTTP: requests translated onto the chat
// pipeline (the same Harmony prompt as the equivalent chat request, history
// of previous_response_id first, errors named as Responses fields) and
// recorded Harmony token sequences, decoded by the request session's
// ChoiceDecoder, turned into output items and events.
#include <gtest/gtest.h>

#include "common/harmony/openai.h"
#include "common/harmony/renderer.h"
#include "coordinator/choice_decoder.h"
#include "coordinator/http/responses_request.h"
#include "coordinator/http/responses_stream.h"
#include "tests/harmony_completion.h"

namespace flotilla::coordinator {
namespace {

namespace tk = tokenizer;
using test_support::Assistant, test_support::Completion, test_support::Tok;

const char kArgs[] = R"({"location":"Tokyo, JP"})";
const Json kWeatherTool = {{"type", "function"},
                           {"name", "get_weather"},
                           {"description", "Gets the weather"},
                           {"parameters",
                            {{"type", "object"},
                             {"properties", {{"location", {{"type", "string"}}}}},
                             {"required", {"location"}}}}};

// Decodes generated tokens as a RequestSession of one Harmony choice does
// (its call ids seeded with the response id) and serializes the events.
class Generation {
 public:
  explicit Generation(ResponsesStream& stream)
      : stream_(stream),
        decoder_(&Tok(), Decoding::kHarmony, 0, stream.Response()["id"].get<std::string>(), {}) {}

  std::vector<Json> Feed(const std::vector<tk::TokenId>& ids) {
    std::vector<RequestEvent> events;
    decoder_.Feed(ids, events);
    return stream_.Consume(events);
  }
  // The end of the choice and then the session's terminal kUsage.
  std::vector<Json> Finish(common::FinishReason reason, std::optional<tk::TokenId> stop,
                           uint32_t completion_tokens) {
    std::vector<RequestEvent> events;
    decoder_.Finish(reason, stop, TokenUsage{12, completion_tokens}, events);
    RequestEvent end;
    end.kind = RequestEvent::Kind::kUsage;
    end.usage = events.back().usage;
    events.push_back(end);
    return stream_.Consume(events);
  }

 private:
  ResponsesStream& stream_;
  ChoiceDecoder decoder_;
};

// Feeds `ids` one token at a time; returns every event.
std::vector<Json> Generate(ResponsesStream& s, const std::vector<tk::TokenId>& ids,
                           tk::TokenId stop, common::FinishReason reason = common::STOP) {
  Generation generation(s);
  std::vector<Json> events = s.Begin();
  for (tk::TokenId t : ids) {
    for (Json& e : generation.Feed({t})) events.push_back(std::move(e));
  }
  for (Json& e : generation.Finish(
           reason, reason == common::STOP ? std::optional<tk::TokenId>(stop) : std::nullopt,
           static_cast<uint32_t>(ids.size() + 1))) {
    events.push_back(std::move(e));
  }
  return events;
}

std::vector<std::string> Types(const std::vector<Json>& events) {
  std::vector<std::string> types;
  for (const Json& e : events) types.push_back(e["type"]);
  return types;
}

TEST(ResponsesStreamTest, ReasoningAndToolCallBecomeItemsAndEvents) {
  tk::TokenId stop;
  const std::vector<tk::TokenId> ids =
      Completion({Assistant("analysis", "Need the weather."),
                  Assistant("commentary", kArgs, "functions.get_weather")},
                 &stop);
  ASSERT_EQ(stop, tk::kCall);
  ResponsesStream s("resp_1", "gpt-oss", Json{{"store", true}}, 7);
  const std::vector<Json> events = Generate(s, ids, stop);

  for (size_t i = 0; i < events.size(); ++i) EXPECT_EQ(events[i]["sequence_number"], i);
  std::vector<std::string> types = Types(events);
  // Deltas vary with the tokenization; the rest is fixed.
  std::erase_if(types, [](const std::string& t) { return t.ends_with(".delta"); });
  EXPECT_EQ(types, (std::vector<std::string>{
                       "response.created", "response.in_progress", "response.output_item.added",
                       "response.content_part.added", "response.reasoning_text.done",
                       "response.content_part.done", "response.output_item.done",
                       "response.output_item.added", "response.function_call_arguments.done",
                       "response.output_item.done", "response.completed"}));
  std::string reasoning, arguments;
  for (const Json& e : events) {
    if (e["type"] == "response.reasoning_text.delta") reasoning += e["delta"].get<std::string>();
    if (e["type"] == "response.function_call_arguments.delta")
      arguments += e["delta"].get<std::string>();
  }
  EXPECT_EQ(reasoning, "Need the weather.");
  EXPECT_EQ(arguments, kArgs);

  const Json r = s.Response();
  EXPECT_EQ(events.back()["response"], r);
  EXPECT_EQ(r["status"], "completed");
  EXPECT_EQ(r["object"], "response");
  EXPECT_EQ(r["store"], true);
  ASSERT_EQ(r["output"].size(), 2u);
  const Json& rs = r["output"][0];
  EXPECT_EQ(rs["type"], "reasoning");
  EXPECT_EQ(rs["content"][0], (Json{{"type", "reasoning_text"}, {"text", "Need the weather."}}));
  const Json& fc = r["output"][1];
  EXPECT_EQ(fc["type"], "function_call");
  EXPECT_EQ(fc["name"], "get_weather");
  EXPECT_EQ(fc["arguments"], kArgs);
  EXPECT_EQ(fc["status"], "completed");
  // The call id chat completions would give the same call.
  EXPECT_EQ(fc["call_id"], harmony::ToolCallId("resp_1", 0, "get_weather"));
  EXPECT_NE(rs["id"], fc["id"]);
  EXPECT_EQ(r["usage"]["input_tokens"], 12);
  EXPECT_EQ(r["usage"]["output_tokens"], ids.size() + 1);
  EXPECT_GT(r["usage"]["output_tokens_details"]["reasoning_tokens"].get<int>(), 0);
  EXPECT_LT(r["usage"]["output_tokens_details"]["reasoning_tokens"].get<size_t>(), ids.size());
}

TEST(ResponsesStreamTest, FinalAnswerIsAMessageAndStreamedEqualsWhole) {
  tk::TokenId stop;
  const std::vector<tk::TokenId> ids =
      Completion({Assistant("analysis", "Say hi."), Assistant("final", "Hello, wörld!")}, &stop);
  stop =
      tk::kReturn;  // rendered as history the answer ends with <|end|>; generated, with <|return|>
  ResponsesStream streamed("resp_2", "m", Json::object(), 1);
  const std::vector<Json> events = Generate(streamed, ids, stop);
  ResponsesStream whole("resp_2", "m", Json::object(), 1);
  Generation at_once(whole);
  at_once.Feed(ids);
  at_once.Finish(common::STOP, stop, static_cast<uint32_t>(ids.size() + 1));
  EXPECT_EQ(streamed.Response(), whole.Response());

  const Json response = whole.Response();
  const Json& msg = response["output"][1];
  EXPECT_EQ(msg["type"], "message");
  EXPECT_EQ(msg["role"], "assistant");
  EXPECT_EQ(msg["content"][0]["type"], "output_text");
  EXPECT_EQ(msg["content"][0]["text"], "Hello, wörld!");
  std::string text;
  for (const Json& e : events) {
    if (e["type"] == "response.output_text.delta") {
      text += e["delta"].get<std::string>();
      EXPECT_EQ(e["item_id"], msg["id"]);
      EXPECT_EQ(e["output_index"], 1);
      EXPECT_EQ(e["content_index"], 0);
    }
    if (e["type"] == "response.output_text.done") {
      EXPECT_EQ(e["text"], "Hello, wörld!");
    }
  }
  EXPECT_EQ(text, "Hello, wörld!");
  // The created event carries the response in progress, without output.
  EXPECT_EQ(events[0]["response"]["status"], "in_progress");
  EXPECT_TRUE(events[0]["response"]["output"].empty());
}

// Each message the answer shows is an item of its own, two on one channel
// too; a built-in tool's call is not shown, as in chat completions.
TEST(ResponsesStreamTest, EachShownMessageIsAnItem) {
  tk::TokenId stop;
  const std::vector<tk::TokenId> ids = Completion(
      {Assistant("analysis", "Think."), Assistant("commentary", "Checking."),
       Assistant("commentary", R"({"q":"x"})", "browser.search"), Assistant("final", "Done.")},
      &stop);
  ResponsesStream s("resp_5", "m", Json::object(), 1);
  const std::vector<Json> events = Generate(s, ids, tk::kReturn);
  const Json r = s.Response();
  ASSERT_EQ(r["output"].size(), 3u) << r.dump();
  EXPECT_EQ(r["output"][0]["type"], "reasoning");
  EXPECT_EQ(r["output"][1]["type"], "message");
  EXPECT_EQ(r["output"][1]["content"][0]["text"], "Checking.");
  EXPECT_EQ(r["output"][2]["type"], "message");
  EXPECT_EQ(r["output"][2]["content"][0]["text"], "Done.");
  for (const Json& item : r["output"]) EXPECT_EQ(item["status"], "completed");
  int added = 0;
  for (const Json& e : events) added += e["type"] == "response.output_item.added";
  EXPECT_EQ(added, 3);
}

TEST(ResponsesStreamTest, LengthLimitMakesItIncomplete) {
  tk::TokenId stop;
  std::vector<tk::TokenId> ids = Completion({Assistant("final", "a long answer cut short")}, &stop);
  ids.resize(ids.size() - 2);
  ResponsesStream s("resp_3", "m", Json::object(), 1);
  const std::vector<Json> events = Generate(s, ids, stop, common::LENGTH);
  EXPECT_EQ(events.back()["type"], "response.incomplete");
  const Json r = s.Response();
  EXPECT_EQ(r["status"], "incomplete");
  EXPECT_EQ(r["incomplete_details"]["reason"], "max_output_tokens");
  ASSERT_EQ(r["output"].size(), 1u);
  EXPECT_EQ(r["output"][0]["status"], "incomplete");
  // An error event is numbered after the rest.
  const Json error = s.ErrorEvent("", "the request's deadline passed", "");
  EXPECT_EQ(error["type"], "error");
  EXPECT_EQ(error["sequence_number"], events.size());
  EXPECT_TRUE(error["code"].is_null());
}

// A header the length limit cut off (no `<|message|>`) still answers with
// what can be read of it, as chat completions shows it.
TEST(ResponsesStreamTest, HeaderCutOffByTheLimitShowsAsChatShowsIt) {
  std::vector<tk::TokenId> ids = *Tok().EncodeOrdinary("final lorem ipsum dolor");
  ids.insert(ids.begin(), tk::kChannel);
  ResponsesStream s("resp_4", "m", Json::object(), 1);
  const std::vector<Json> events = Generate(s, ids, 0, common::LENGTH);
  ResponseBuilder chat(&Tok(), Endpoint::kChat, "chatcmpl-4", "m", 1, {}, false);
  chat.Feed(ids, {});
  chat.Finish(common::LENGTH, std::nullopt, 12, static_cast<uint32_t>(ids.size()));
  const std::string content = chat.Response()["choices"][0]["message"]["content"];
  ASSERT_EQ(content, "lorem ipsum dolor");
  const Json r = s.Response();
  ASSERT_EQ(r["output"].size(), 1u);
  EXPECT_EQ(r["output"][0]["type"], "message");
  EXPECT_EQ(r["output"][0]["content"][0]["text"], content);
  EXPECT_EQ(events.back()["type"], "response.incomplete");
}

// ---- requests ----

Json Request(Json extra) {
  Json body = {{"model", "m"}, {"input", "What is the weather in Tokyo?"}};
  for (auto& [key, value] : extra.items()) body[key] = value;
  return body;
}

std::vector<tk::TokenId> ResponsesPrompt(const Json& body, const Json& history = Json::array()) {
  absl::StatusOr<ResponsesRequest> r = ParseResponsesRequest(body);
  EXPECT_TRUE(r.ok()) << r.status();
  if (!r.ok()) return {};
  absl::StatusOr<PreparedRequest> p = PrepareResponsesRequest(*r, history, "m", Tok(), {});
  EXPECT_TRUE(p.ok()) << p.status();
  return p.ok() ? p->prompt : std::vector<tk::TokenId>();
}

std::vector<tk::TokenId> ChatPrompt(const Json& body) {
  absl::StatusOr<PreparedRequest> p = PrepareChatRequest(body, "m", Tok(), {});
  EXPECT_TRUE(p.ok()) << p.status();
  return p.ok() ? p->prompt : std::vector<tk::TokenId>();
}

TEST(ResponsesRequestTest, SamePromptAsTheEquivalentChatRequest) {
  const Json responses = Request({{"instructions", "Be brief."},
                                  {"tools", {kWeatherTool}},
                                  {"reasoning", {{"effort", "high"}}},
                                  {"max_output_tokens", 50}});
  Json chat_tool = {{"type", "function"},
                    {"function",
                     {{"name", "get_weather"},
                      {"description", "Gets the weather"},
                      {"parameters", kWeatherTool["parameters"]}}}};
  const Json chat = {{"model", "m"},
                     {"messages",
                      {{{"role", "developer"}, {"content", "Be brief."}},
                       {{"role", "user"}, {"content", "What is the weather in Tokyo?"}}}},
                     {"tools", {chat_tool}},
                     {"reasoning_effort", "high"}};
  EXPECT_EQ(ResponsesPrompt(responses), ChatPrompt(chat));

  absl::StatusOr<ResponsesRequest> r = ParseResponsesRequest(responses);
  ASSERT_TRUE(r.ok());
  absl::StatusOr<PreparedRequest> p = PrepareResponsesRequest(*r, Json::array(), "m", Tok(), {});
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->sampling.max_tokens(), 50u);
  // Function tools are strict unless they say otherwise, as in the Responses API.
  ASSERT_TRUE(p->constraint.has_value());
  EXPECT_TRUE(p->constraint->tools.at(0).constrained);
  EXPECT_FALSE(p->constraint->tool_required);
}

// A tool round trip: the reasoning and the call of the first turn stay in
// the prompt (Harmony keeps the analysis before a call), whether the items
// come from the store or from the client.
TEST(ResponsesRequestTest, RoundTripItemsAndHistoryGiveTheSamePrompt) {
  const Json first_turn = Json::array(
      {{{"type", "message"}, {"role", "user"}, {"content", "What is the weather in Tokyo?"}},
       {{"type", "reasoning"},
        {"id", "rs_1"},
        {"summary", Json::array()},
        {"content", {{{"type", "reasoning_text"}, {"text", "Need the weather."}}}}},
       {{"type", "function_call"},
        {"call_id", "call_9"},
        {"name", "get_weather"},
        {"arguments", kArgs}}});
  const Json output = {
      {"type", "function_call_output"}, {"call_id", "call_9"}, {"output", "20 C, sunny"}};
  Json all = first_turn;
  all.push_back(output);
  const Json tools = Json::array({kWeatherTool});
  const std::vector<tk::TokenId> explicit_items =
      ResponsesPrompt(Request({{"input", all}, {"tools", tools}}));
  const std::vector<tk::TokenId> from_store = ResponsesPrompt(
      Request(
          {{"input", Json::array({output})}, {"tools", tools}, {"previous_response_id", "resp_1"}}),
      first_turn);
  EXPECT_EQ(explicit_items, from_store);

  Json chat_tool = {{"type", "function"},
                    {"function",
                     {{"name", "get_weather"},
                      {"description", "Gets the weather"},
                      {"parameters", kWeatherTool["parameters"]}}}};
  const Json chat = {
      {"model", "m"},
      {"tools", {chat_tool}},
      {"messages",
       {{{"role", "user"}, {"content", "What is the weather in Tokyo?"}},
        {{"role", "assistant"},
         {"reasoning_content", "Need the weather."},
         {"tool_calls",
          {{{"id", "call_9"},
            {"type", "function"},
            {"function", {{"name", "get_weather"}, {"arguments", kArgs}}}}}}},
        {{"role", "tool"}, {"tool_call_id", "call_9"}, {"content", "20 C, sunny"}}}}};
  EXPECT_EQ(explicit_items, ChatPrompt(chat));
  const std::string text = *Tok().DecodeBytes(explicit_items);
  EXPECT_NE(text.find("<|channel|>analysis<|message|>Need the weather."), std::string::npos)
      << text;
  EXPECT_NE(text.find("functions.get_weather to=assistant"), std::string::npos) << text;
}

// After a final answer, Harmony drops the turn's analysis from the prompt;
// the stored reasoning item does not bring it back.
TEST(ResponsesRequestTest, ReasoningBeforeAFinalAnswerIsDroppedOnTheNextTurn) {
  const Json history =
      Json::array({{{"type", "message"}, {"role", "user"}, {"content", "Hi"}},
                   {{"type", "reasoning"},
                    {"summary", Json::array()},
                    {"content", {{{"type", "reasoning_text"}, {"text", "Greet back."}}}}},
                   {{"type", "message"},
                    {"role", "assistant"},
                    {"content", {{{"type", "output_text"}, {"text", "Hello!"}}}}}});
  const std::vector<tk::TokenId> prompt = ResponsesPrompt(
      Request({{"input", "And now?"}, {"previous_response_id", "resp_0"}}), history);
  const std::string text = *Tok().DecodeBytes(prompt);
  EXPECT_EQ(text.find("Greet back."), std::string::npos) << text;
  EXPECT_NE(text.find("<|channel|>final<|message|>Hello!<|end|>"), std::string::npos) << text;
  EXPECT_NE(text.find("And now?"), std::string::npos) << text;
}

TEST(ResponsesRequestTest, TextFormatAndToolChoiceBecomeTheConstraint) {
  absl::StatusOr<ResponsesRequest> r = ParseResponsesRequest(
      Request({{"text",
                {{"format",
                  {{"type", "json_schema"}, {"name", "w"}, {"schema", {{"type", "object"}}}}}}}}));
  ASSERT_TRUE(r.ok()) << r.status();
  absl::StatusOr<PreparedRequest> p = PrepareResponsesRequest(*r, Json::array(), "m", Tok(), {});
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_TRUE(p->constraint.has_value());
  EXPECT_TRUE(p->constraint->json_final);
  EXPECT_EQ(Json::parse(p->constraint->final_schema), (Json{{"type", "object"}}));

  r = ParseResponsesRequest(Request({{"tools", {kWeatherTool}}, {"tool_choice", "required"}}));
  ASSERT_TRUE(r.ok()) << r.status();
  p = PrepareResponsesRequest(*r, Json::array(), "m", Tok(), {});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(p->constraint->tool_required);

  r = ParseResponsesRequest(
      Request({{"tools", {kWeatherTool}},
               {"tool_choice", {{"type", "function"}, {"name", "get_weather"}}}}));
  ASSERT_TRUE(r.ok()) << r.status();
  p = PrepareResponsesRequest(*r, Json::array(), "m", Tok(), {});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(p->constraint->tool_required);
}

TEST(ResponsesRequestTest, ErrorsNameTheResponsesField) {
  struct Case {
    Json extra;
    const char* param;
  } cases[] = {
      {{{"tools", {{{"type", "web_search"}}}}}, "tools[0].type"},
      {{{"tools", {{{"type", "function"}}}}}, "tools[0].name"},
      {{{"input", {{{"role", "user"}, {"content", "hi"}}, {{"type", "image_generation_call"}}}}},
       "input[1].type"},
      {{{"input", {{{"role", "user"}, {"content", {{{"type", "input_image"}}}}}}}},
       "input[0].content[0].type"},
      {{{"input", {{{"role", "robot"}, {"content", "hi"}}}}}, "input[0].role"},
      {{{"input", {{{"type", "function_call_output"}, {"call_id", "nope"}, {"output", "x"}}}}},
       "input[0].call_id"},
      {{{"input", {{{"type", "reasoning"}, {"encrypted_content", "xx"}}}}},
       "input[0].encrypted_content"},
      {{{"input", 5}}, "input"},
      {{{"background", true}, {"store", false}}, "background"},
      {{{"background", "yes"}}, "background"},
      {{{"include", {"message.output_text.logprobs"}}}, "include[0]"},
      {{{"include", {"reasoning.encrypted_content", "file_search_call.results"}}}, "include[1]"},
      {{{"include", "reasoning.encrypted_content"}}, "include"},
      {{{"truncation", "auto"}}, "truncation"},
      {{{"conversation", "conv_1"}}, "conversation"},
      {{{"max_tool_calls", 0}}, "max_tool_calls"},
      {{{"prompt", {{"id", "pmpt_1"}}}}, "prompt"},
      {{{"reasoning", {{"effort", "minimal"}}}}, "reasoning.effort"},
      {{{"max_output_tokens", 0}}, "max_output_tokens"},
      {{{"temperature", 9}}, "temperature"},
      {{{"tool_choice", {{"type", "file_search"}}}}, "tool_choice.type"},
      {{{"tool_choice", "required"}}, "tool_choice"},
      {{{"tools", {kWeatherTool}}, {"tool_choice", {{"type", "function"}, {"name", "other"}}}},
       "tool_choice.name"},
      {{{"text", {{"format", {{"type", "yaml"}}}}}}, "text.format.type"},
      {{{"text",
         {{"format",
           {{"type", "json_schema"},
            {"name", "x"},
            {"schema", {{"type", "object"}, {"patternProperties", Json::object()}}}}}}}},
       "text.format.schema"},
      {{{"metadata", {{"k", 1}}}}, "metadata.k"},
      {{{"tools", {{{"type", "function"}, {"name", "f"}, {"strict", "yes"}}}}}, "tools[0].strict"},
      {{{"text", {{"format", {{"type", "json_schema"}, {"name", "x"}}}}}}, "text.format.schema"},
      {{{"input",
         {{{"type", "function_call"}, {"call_id", "c1"}, {"name", "f"}, {"arguments", "{}"}},
          {{"type", "function_call_output"}, {"call_id", "c2"}, {"output", "x"}}}}},
       "input[1].call_id"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<PreparedRequest> p = absl::InternalError("unset");
    absl::StatusOr<ResponsesRequest> r = ParseResponsesRequest(Request(c.extra));
    if (r.ok()) {
      p = PrepareResponsesRequest(*r, Json::array(), "m", Tok(), {});
    } else {
      p = r.status();
    }
    ASSERT_FALSE(p.ok()) << c.extra.dump();
    const ApiError e = ErrorFromStatus(p.status());
    EXPECT_EQ(e.http_status, 400) << c.extra.dump() << ": " << e.message;
    EXPECT_EQ(e.param.substr(0, std::string(c.param).size()), c.param)
        << c.extra.dump() << ": " << e.message;
  }
}

// What a stored response brought is named by previous_response_id, and a
// prompt over the byte limit by input: the fields the client sent.
TEST(ResponsesRequestTest, HistoryAndPromptSizeErrorsNameTheRequestsFields) {
  absl::StatusOr<ResponsesRequest> r = ParseResponsesRequest(Request(
      {{"previous_response_id", "resp_1"},
       {"input", {{{"type", "function_call_output"}, {"call_id", "c9"}, {"output", "x"}}}}}));
  ASSERT_TRUE(r.ok()) << r.status();
  const Json history = {{{"type", "function_call_output"}, {"call_id", "gone"}, {"output", "y"}}};
  absl::StatusOr<PreparedRequest> p = PrepareResponsesRequest(*r, history, "m", Tok(), {});
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(ErrorFromStatus(p.status()).param, "previous_response_id") << p.status();

  r = ParseResponsesRequest(Request({{"input", std::string(4096, 'x')}}));
  ASSERT_TRUE(r.ok()) << r.status();
  p = PrepareResponsesRequest(*r, Json::array(), "m", Tok(), {}, /*max_prompt_text_bytes=*/1024);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(ErrorFromStatus(p.status()).param, "input") << p.status();
}

TEST(ResponsesRequestTest, SettingsAreRepeatedInTheResponse) {
  absl::StatusOr<ResponsesRequest> r =
      ParseResponsesRequest(Request({{"instructions", "Be brief."},
                                     {"tools", {kWeatherTool}},
                                     {"store", false},
                                     {"temperature", 0},
                                     {"metadata", {{"k", "v"}}},
                                     {"reasoning", {{"effort", "low"}}}}));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->store);
  const Json s = ResponseSettings(*r);
  EXPECT_EQ(s["instructions"], "Be brief.");
  EXPECT_EQ(s["tools"][0]["name"], "get_weather");
  EXPECT_EQ(s["tools"][0]["strict"], true);
  EXPECT_EQ(s["store"], false);
  EXPECT_EQ(s["temperature"], 0);
  EXPECT_EQ(s["metadata"]["k"], "v");
  EXPECT_EQ(s["reasoning"]["effort"], "low");
  EXPECT_EQ(s["tool_choice"], "auto");
  EXPECT_EQ(s["text"]["format"]["type"], "text");
}

}  // namespace
}  // namespace flotilla::coordinator
