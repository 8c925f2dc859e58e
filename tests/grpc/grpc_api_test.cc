// The gRPC client API end to end: a LocalCluster (real coordinator and worker
// processes) on the default synthetic model, driven by an independent node
// client (@grpc/grpc-js + @grpc/proto-loader loading proto/flotilla.proto)
// and by the C++ SDK. Cancels and deadlines must free the sequence, as
// /metrics shows.
#include <gtest/gtest.h>
#include <httplib.h>
#include <sys/wait.h>

#include <atomic>
#include <cstdlib>
#include <map>
#include <regex>
#include <thread>
#include <tuple>

#include "tests/common/json_schema_validator.h"
#include "tests/local_cluster_suite.h"
#include "tests/run_command.h"
#include "tools/sdk/client.h"

namespace flotilla {
namespace {

class GrpcApiTest : public testing_util::LocalClusterSuite<GrpcApiTest> {
 protected:
  static std::unique_ptr<client::Client> Sdk(absl::Duration deadline = absl::Minutes(2)) {
    client::ClientOptions o;
    o.address = cluster_->address();
    o.deadline = deadline;
    auto c = client::Client::Create(o);
    EXPECT_TRUE(c.ok()) << c.status();
    return *std::move(c);
  }
  static v1::ChatRequest Hello(uint32_t max_tokens) {
    v1::ChatRequest r;
    *r.add_messages() = client::MakeChatMessage(v1::ChatMessage::SYSTEM, "You are terse.");
    *r.add_messages() =
        client::MakeChatMessage(v1::ChatMessage::USER, "What is the capital of France?");
    r.set_reasoning_effort(v1::LOW);
    r.mutable_sampling()->set_temperature(0);
    r.mutable_sampling()->set_max_tokens(max_tokens);
    return r;
  }
  // The requests /metrics counts as finished for `reason` (0 when none yet).
  static double Finished(const std::string& reason) {
    httplib::Client c("http://" + cluster_->http_address());
    auto m = c.Get("/metrics");
    if (!m) return -1;
    std::smatch g;
    const std::regex series("\nflotilla_requests_finished_total\\{[^}]*finished_reason=\"" +
                            reason + "\"\\} ([0-9.e+-]+)");
    return std::regex_search(m->body, g, series) ? std::stod(g[1]) : 0;
  }
  // Waits until /metrics counts tokens generated past `before`: on an idle
  // cluster, the one request is running (the random synthetic model's
  // tokens need not parse into streamed text).
  static bool WaitGenerating(double before) {
    for (int i = 0; i < 200; ++i) {
      if (Metric("flotilla_generation_tokens_total") > before) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }
};

TEST_F(GrpcApiTest, IndependentNodeClient) {
  const std::string cmd = std::string("NODE_PATH=") + FLOTILLA_NODE_MODULES + " " + FLOTILLA_NODE +
                          " " + FLOTILLA_GRPC_TEST_DIR + "/grpc_client_test.js " +
                          FLOTILLA_SOURCE_DIR + " " + cluster_->address() + " " +
                          cluster_->http_address() + " " + Model();
  const auto [rc, out] = testing_util::RunCommandWithStderr(cmd);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("all ok"), std::string::npos) << out;
  std::cout << out;
}

TEST_F(GrpcApiTest, SdkChatStreamedEqualsBlocking) {
  auto c = Sdk();
  const double ttft_before = Metric("flotilla_time_to_first_token_seconds_count");
  const double itl_before = Metric("flotilla_inter_token_latency_seconds_count");
  const double generated_before = Metric("flotilla_generation_tokens_total");
  absl::StatusOr<client::ChatResult> whole = c->Chat(Hello(24));
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_NE(whole->finish_reason, v1::ChatResponse::FINISH_REASON_UNSPECIFIED);
  EXPECT_NE(whole->finish_reason, v1::ChatResponse::CANCELLED);
  EXPECT_GT(whole->prompt_tokens, 20u);
  EXPECT_GT(whole->completion_tokens, 0u);
  EXPECT_LE(whole->completion_tokens, 24u);
  EXPECT_FALSE(whole->request_id.empty());
  // gRPC requests count in the latency histograms and token counters of
  // /metrics like HTTP ones.
  EXPECT_GE(Metric("flotilla_time_to_first_token_seconds_count"), ttft_before + 1);
  EXPECT_GE(Metric("flotilla_inter_token_latency_seconds_count"),
            itl_before + static_cast<double>(whole->completion_tokens) - 1);
  EXPECT_GE(Metric("flotilla_generation_tokens_total"),
            generated_before + static_cast<double>(whole->completion_tokens));

  client::ChatResult streamed;
  int messages = 0, finishes = 0;
  absl::Status st = c->ChatStream(Hello(24), [&](const v1::ChatResponse& r) {
    if (messages++ == 0) {
      EXPECT_FALSE(r.request_id().empty());
      EXPECT_TRUE(r.deltas().empty()) << "the first message only names the request";
    }
    for (const v1::ChatDelta& d : r.deltas()) {
      EXPECT_NE(d.delta_case(), v1::ChatDelta::DELTA_NOT_SET);
    }
    if (r.finish_reason() != v1::ChatResponse::FINISH_REASON_UNSPECIFIED) ++finishes;
    streamed.Add(r);
  });
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_EQ(finishes, 1);
  // Greedy: the same reply, split the same way into reasoning and answer.
  EXPECT_EQ(streamed.content, whole->content);
  EXPECT_EQ(streamed.reasoning, whole->reasoning);
  EXPECT_EQ(streamed.finish_reason, whole->finish_reason);
  EXPECT_EQ(streamed.completion_tokens, whole->completion_tokens);
  EXPECT_EQ(streamed.prompt_tokens, whole->prompt_tokens);

  // The reply continues the conversation.
  v1::ChatRequest next = Hello(4);
  *next.add_messages() = whole->AsMessage();
  *next.add_messages() = client::MakeChatMessage(v1::ChatMessage::USER, "And of Italy?");
  absl::StatusOr<client::ChatResult> second = c->Chat(next);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_GT(second->prompt_tokens, whole->prompt_tokens);
}

TEST_F(GrpcApiTest, SdkBadInputIsInvalidArgument) {
  auto c = Sdk();
  v1::ChatRequest empty;
  absl::StatusOr<client::ChatResult> r = c->Chat(empty);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("messages"), std::string::npos) << r.status();

  v1::ChatRequest bad_temp = Hello(4);
  bad_temp.mutable_sampling()->set_temperature(5);
  r = c->Chat(bad_temp);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("sampling.temperature"), std::string::npos) << r.status();

  v1::ChatRequest orphan = Hello(4);
  *orphan.add_messages() = client::MakeToolResult("call_unknown", "42");
  r = c->Chat(orphan);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("tool_call_id"), std::string::npos) << r.status();

  v1::ChatRequest other = Hello(4);
  other.set_model("not-this-one");
  r = c->Chat(other);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);

  // The server is fine afterwards.
  EXPECT_TRUE(c->Chat(Hello(2)).ok());
}

// Generate with n: n sequences interleaved, each message naming its index,
// each ending with its own finish reason and usage; seed + i per sequence.
TEST_F(GrpcApiTest, GenerateNSequencesEachWithItsIndex) {
  auto c = Sdk();
  v1::GenerateRequest g;
  g.set_text("Once upon a time");
  g.set_n(3);
  g.mutable_sampling()->set_max_tokens(6);
  g.mutable_sampling()->set_temperature(1);
  g.mutable_sampling()->set_seed(5);
  auto run = [&] {
    std::map<uint32_t, std::vector<int32_t>> tokens;
    std::map<uint32_t, uint32_t> completion;
    absl::Status st = c->GenerateStream(g, [&](const v1::GenerateResponse& r) {
      EXPECT_LT(r.index(), 3u);
      tokens[r.index()].insert(tokens[r.index()].end(), r.token_ids().begin(), r.token_ids().end());
      if (r.finish_reason() != common::FINISH_REASON_UNSPECIFIED) {
        completion[r.index()] = r.usage().completion_tokens();
      }
    });
    EXPECT_TRUE(st.ok()) << st;
    return std::make_pair(tokens, completion);
  };
  auto [tokens, completion] = run();
  ASSERT_EQ(tokens.size(), 3u);
  ASSERT_EQ(completion.size(), 3u);
  for (uint32_t i = 0; i < 3; ++i) {
    EXPECT_EQ(tokens[i].size(), 6u) << i;
    EXPECT_EQ(completion[i], 6u) << i;
  }
  EXPECT_FALSE(tokens[0] == tokens[1] && tokens[1] == tokens[2]) << "three identical samples";
  EXPECT_EQ(run().first, tokens) << "the same seed gives the same sequences";

  g.set_n(17);
  absl::StatusOr<client::GenerateResult> refused = c->Generate(g);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("n:"), std::string::npos) << refused.status();
}

// Chat with n: the choices' messages name their index, each choice ends with
// its own finish reason and usage, the stream closes after the last; seed + i.
TEST_F(GrpcApiTest, ChatNChoicesEachWithItsIndex) {
  auto c = Sdk();
  v1::ChatRequest req = Hello(6);
  req.set_n(3);
  req.set_return_token_ids(true);  // six random tokens rarely make visible text
  req.mutable_sampling()->set_temperature(1);
  req.mutable_sampling()->set_seed(5);
  auto run = [&] {
    std::map<uint32_t, std::vector<int32_t>> tokens;
    std::map<uint32_t, uint32_t> completion;
    int after_end = 0;
    absl::Status st = c->ChatStream(req, [&](const v1::ChatResponse& r) {
      EXPECT_LT(r.index(), 3u);
      if (completion.count(r.index()) > 0) ++after_end;
      tokens[r.index()].insert(tokens[r.index()].end(), r.token_ids().begin(), r.token_ids().end());
      if (r.finish_reason() != v1::ChatResponse::FINISH_REASON_UNSPECIFIED) {
        EXPECT_EQ(r.finish_reason(), v1::ChatResponse::LENGTH);
        completion[r.index()] = r.usage().completion_tokens();
      }
    });
    EXPECT_TRUE(st.ok()) << st;
    EXPECT_EQ(after_end, 0) << "a choice spoke after its last message";
    return std::make_pair(tokens, completion);
  };
  auto [tokens, completion] = run();
  ASSERT_EQ(completion.size(), 3u);
  for (uint32_t i = 0; i < 3; ++i) {
    EXPECT_EQ(completion[i], 6u) << i;
    EXPECT_EQ(tokens[i].size(), 6u) << i;
  }
  EXPECT_FALSE(tokens[0] == tokens[1] && tokens[1] == tokens[2]) << "three identical samples";
  EXPECT_EQ(run().first, tokens) << "the same seed gives the same choices";

  req.set_n(17);
  absl::Status refused = c->ChatStream(req, [](const v1::ChatResponse&) {});
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("n:"), std::string::npos) << refused;
}

TEST_F(GrpcApiTest, CancelByIdEndsTheStreamInBand) {
  auto c = Sdk();
  ASSERT_TRUE(WaitIdle());
  const double cancelled = Metric("flotilla_requests_cancelled_total");
  const double generated = Metric("flotilla_generation_tokens_total");
  client::ChatResult result;
  std::string id;
  v1::ChatRequest req = Hello(0);  // up to the context: only a cancel ends it soon
  req.mutable_sampling()->set_temperature(1);
  // The first message names the request; once it generates (and only the
  // context length, thousands of tokens away, or a cancel ends it) another
  // call cancels it by that id.
  std::thread canceller;
  std::atomic<int> found{-1};
  absl::Status st = c->ChatStream(req, [&](const v1::ChatResponse& r) {
    result.Add(r);
    if (!id.empty()) return;
    id = r.request_id();
    canceller = std::thread([&, id] {
      EXPECT_TRUE(WaitGenerating(generated));
      absl::StatusOr<bool> f = c->Cancel(id);
      found = f.ok() ? (*f ? 1 : 0) : 2;
    });
  });
  if (canceller.joinable()) canceller.join();
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_EQ(found.load(), 1);
  EXPECT_EQ(result.finish_reason, v1::ChatResponse::CANCELLED);
  EXPECT_GT(result.completion_tokens, 0u);
  ASSERT_TRUE(WaitIdle()) << "the cancelled sequence still runs";
  EXPECT_GE(Metric("flotilla_requests_cancelled_total"), cancelled + 1);
  absl::StatusOr<bool> again = c->Cancel(id);
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(*again);
}

TEST_F(GrpcApiTest, DeadlineAndClientCancelFreeTheSequence) {
  ASSERT_TRUE(WaitIdle());
  const double cancelled = Metric("flotilla_requests_cancelled_total");
  const double deadlines = Finished("deadline");
  const double cancels = Finished("cancelled");
  {
    auto c = Sdk(absl::Seconds(1));
    v1::ChatRequest req = Hello(0);
    req.mutable_sampling()->set_temperature(1);
    absl::StatusOr<client::ChatResult> r = c->Chat(req);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded) << r.status();
  }
  ASSERT_TRUE(WaitIdle()) << "the sequence outlived its deadline";
  // gRPC tells the server of a passed deadline as a cancel: it still counts
  // as a deadline.
  EXPECT_EQ(Finished("deadline"), deadlines + 1);
  EXPECT_EQ(Finished("cancelled"), cancels);
  {
    auto c = Sdk();
    client::CancelHandle cancel;
    v1::ChatRequest req = Hello(0);
    req.mutable_sampling()->set_temperature(1);
    const double generated = Metric("flotilla_generation_tokens_total");
    std::thread canceller;
    absl::Status st = c->ChatStream(
        req,
        [&](const v1::ChatResponse&) {
          if (canceller.joinable()) return;
          canceller = std::thread([&] {
            EXPECT_TRUE(WaitGenerating(generated));
            cancel.Cancel();
          });
        },
        &cancel);
    if (canceller.joinable()) canceller.join();
    EXPECT_EQ(st.code(), absl::StatusCode::kCancelled) << st;
  }
  ASSERT_TRUE(WaitIdle()) << "the cancelled stream's sequence still runs";
  EXPECT_GE(Metric("flotilla_requests_cancelled_total"), cancelled + 1);
  EXPECT_EQ(Finished("cancelled"), cancels + 1);
  EXPECT_EQ(Finished("deadline"), deadlines + 1);
}

// response_format over gRPC: on the random synthetic model every JSON_SCHEMA
// answer parses and conforms (the constraint, not the model, makes it so).
TEST_F(GrpcApiTest, ResponseFormatJsonSchemaAnswersConform) {
  auto c = Sdk();
  const char* schemas[] = {
      R"({"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
          "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": false})",
      R"({"type": "object", "properties": {"colors": {"type": "array", "minItems": 1,
          "maxItems": 3, "items": {"enum": ["red", "green", "blue"]}},
          "score": {"type": ["number", "null"], "minimum": -1, "maximum": 1}},
          "required": ["colors", "score"], "additionalProperties": false})",
      R"({"type": "object", "properties": {"home": {"$ref": "#/$defs/place"},
          "ok": {"type": "boolean"}}, "required": ["home", "ok"], "additionalProperties": false,
          "$defs": {"place": {"type": "object", "properties": {"zip": {"type": "integer",
          "minimum": 10000, "maximum": 99999}}, "required": ["zip"],
          "additionalProperties": false}}})",
  };
  uint64_t seed = 1;
  for (const char* text : schemas) {
    v1::ChatRequest r = Hello(200);
    r.mutable_sampling()->set_temperature(1);
    r.mutable_sampling()->set_seed(seed++);
    v1::ResponseFormat* format = r.mutable_response_format();
    format->set_type(v1::ResponseFormat::JSON_SCHEMA);
    format->mutable_json_schema()->set_name("answer");
    format->mutable_json_schema()->set_schema_json(text);
    absl::StatusOr<client::ChatResult> reply = c->Chat(r);
    ASSERT_TRUE(reply.ok()) << reply.status();
    EXPECT_EQ(reply->finish_reason, v1::ChatResponse::STOP) << reply->content;
    const nlohmann::json schema = nlohmann::json::parse(text);
    const nlohmann::json answer = nlohmann::json::parse(reply->content, nullptr, false);
    ASSERT_FALSE(answer.is_discarded()) << reply->content;
    EXPECT_TRUE(schema_check::SchemaValid(schema, answer, schema)) << reply->content;
  }

  v1::ChatRequest object = Hello(300);
  object.mutable_response_format()->set_type(v1::ResponseFormat::JSON_OBJECT);
  absl::StatusOr<client::ChatResult> reply = c->Chat(object);
  ASSERT_TRUE(reply.ok()) << reply.status();
  if (reply->finish_reason == v1::ChatResponse::STOP) {  // an open object may run out of tokens
    const nlohmann::json answer = nlohmann::json::parse(reply->content, nullptr, false);
    EXPECT_TRUE(answer.is_object()) << reply->content;
  }
}

// A strict tool forced by tool_choice: the call's arguments conform.
TEST_F(GrpcApiTest, RequiredStrictToolCallArgumentsConform) {
  auto c = Sdk();
  const std::string params = R"({"type": "object", "properties": {
      "a": {"type": "integer", "minimum": -99, "maximum": 99},
      "unit": {"enum": ["c", "f"]}}, "required": ["a", "unit"], "additionalProperties": false})";
  for (uint64_t seed = 1; seed <= 2; ++seed) {
    v1::ChatRequest r = Hello(160);
    r.mutable_sampling()->set_temperature(1);
    r.mutable_sampling()->set_seed(seed);
    v1::Tool* tool = r.add_tools();
    tool->set_name("convert");
    tool->set_parameters_json(params);
    tool->set_strict(true);
    r.mutable_tool_choice()->set_mode(v1::ToolChoice::REQUIRED);
    absl::StatusOr<client::ChatResult> reply = c->Chat(r);
    ASSERT_TRUE(reply.ok()) << reply.status();
    EXPECT_EQ(reply->finish_reason, v1::ChatResponse::TOOL_CALLS);
    ASSERT_EQ(reply->tool_calls.size(), 1u);
    EXPECT_EQ(reply->tool_calls[0].name, "convert");
    const nlohmann::json schema = nlohmann::json::parse(params);
    const nlohmann::json args = nlohmann::json::parse(reply->tool_calls[0].arguments, nullptr, false);
    EXPECT_TRUE(schema_check::SchemaValid(schema, args, schema)) << reply->tool_calls[0].arguments;
  }
}

// Unsupported schema features are INVALID_ARGUMENT naming the proto field
// and the keyword, before any work.
TEST_F(GrpcApiTest, ResponseFormatErrorsNameTheField) {
  auto c = Sdk();
  auto refused = [&](const v1::ChatRequest& r, const std::string& field, const std::string& what) {
    absl::StatusOr<client::ChatResult> reply = c->Chat(r);
    ASSERT_FALSE(reply.ok());
    EXPECT_EQ(reply.status().code(), absl::StatusCode::kInvalidArgument) << reply.status();
    EXPECT_NE(reply.status().message().find(field), std::string::npos) << reply.status();
    EXPECT_NE(reply.status().message().find(what), std::string::npos) << reply.status();
  };
  v1::ChatRequest unsupported = Hello(8);
  unsupported.mutable_response_format()->set_type(v1::ResponseFormat::JSON_SCHEMA);
  unsupported.mutable_response_format()->mutable_json_schema()->set_schema_json(
      R"({"type": "object", "properties": {"s": {"not": {"type": "string"}}}})");
  refused(unsupported, "response_format.json_schema.schema_json", "unsupported keyword 'not'");

  v1::ChatRequest missing = Hello(8);
  missing.mutable_response_format()->set_type(v1::ResponseFormat::JSON_SCHEMA);
  refused(missing, "response_format.json_schema.schema_json", "is required");

  v1::ChatRequest tool = Hello(8);
  tool.add_tools()->set_name("f");
  tool.mutable_tools(0)->set_parameters_json(
      R"({"type": "object", "properties": {"d": {"type": "string", "format": "iri"}}})");
  tool.mutable_tools(0)->set_strict(true);
  refused(tool, "tools[0].parameters_json", "format");
}

// Runs `cmd`, returns its exit status and stdout+stderr.
std::pair<int, std::string> RunCommand(const std::string& cmd) {
  return flotilla::testing_util::RunCommandWithStderr(cmd);
}

TEST_F(GrpcApiTest, ChatCommandOneShotAndConversation) {
  const std::string chat =
      std::string(FLOTILLA_BIN_DIR) + "/flotilla chat --coordinator " + cluster_->address();
  // One shot, piped: the raw completion and the parse, labelled; usage on stderr.
  auto [rc, out] =
      RunCommand(chat +
                 " --prompt 'Hi' --system 'Be brief' --reasoning-effort low --max-tokens 6 "
                 "--temperature 0 --show-harmony");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("harmony: "), std::string::npos) << out;
  EXPECT_NE(out.find("answer: "), std::string::npos) << out;
  EXPECT_NE(out.find("completion tokens]"), std::string::npos) << out;
  // A conversation from stdin: the second turn's prompt holds the first turn
  // (more prompt tokens than the first); /reset drops it again.
  std::tie(rc, out) =
      RunCommand("printf 'Hello\\nHello\\n/reset\\nHello\\n' | " + chat + " --max-tokens 4");
  EXPECT_EQ(rc, 0) << out;
  std::vector<int> prompts;
  std::regex usage("\\[[a-z_]+; (\\d+) prompt \\+ \\d+ completion tokens\\]");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), usage); it != std::sregex_iterator();
       ++it) {
    prompts.push_back(std::stoi((*it)[1]));
  }
  ASSERT_EQ(prompts.size(), 3u) << out;
  EXPECT_GT(prompts[1], prompts[0]) << out;
  EXPECT_EQ(prompts[2], prompts[0]) << out;
  // Another model: NOT_FOUND, exit status 1 with the server's message.
  std::tie(rc, out) = RunCommand(chat + " --prompt 'Hi' --model nope");
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("nope"), std::string::npos) << out;
}

}  // namespace
}  // namespace flotilla
