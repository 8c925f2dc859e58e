// The OpenAI-compatible HTTP API end to end: a LocalCluster (real coordinator
// and worker processes) on the default synthetic model, driven by the official
// `openai` npm client and by raw HTTP for what a client library hides
// (health, metrics, malformed requests, disconnects).
#include <gtest/gtest.h>
#include <httplib.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <thread>

#include "tests/local_cluster_suite.h"
#include "tests/run_command.h"

namespace flotilla {
namespace {

using Json = nlohmann::json;

constexpr char kReasoningKey[] = "5f3c0a9e7d21b4c68e0f1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f";
constexpr char kRotatedReasoningKey[] =
    "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

class HttpApiTest : public testing_util::LocalClusterSuite<HttpApiTest> {
 public:
  static void Configure(cli::LocalClusterOptions&) {
    // The coordinator's --reasoning-key-file, through its variable: a current
    // key and a rotated one (responses_lifecycle_test.js seals and opens with
    // them independently).
    const std::string keys = testing::TempDir() + "flotilla-reasoning-keys-" +
                             std::to_string(getpid());
    std::ofstream(keys) << "# current, then the rotated one\n" << kReasoningKey << "\n"
                        << kRotatedReasoningKey << "\n";
    setenv("FLOTILLA_REASONING_KEY_FILE", keys.c_str(), 1);
  }

 protected:
  static httplib::Client Client() {
    httplib::Client c("http://" + cluster_->http_address());
    c.set_read_timeout(120, 0);
    return c;
  }
  static std::string Chat(const std::string& extra) {
    return R"({"model": ")" + Model() + R"(", "messages": [{"role": "user", "content": "Hi"}])" + extra + "}";
  }

  // A request that ran past its deadline: 504 with an OpenAI timeout_error.
  static void ExpectTimedOut(const httplib::Result& r) {
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 504) << r->body;
    const Json j = Json::parse(r->body, nullptr, false);
    ASSERT_TRUE(j.is_object() && j.contains("error")) << r->body;
    EXPECT_EQ(j["error"]["type"], "timeout_error");
  }

  // Runs tests/http/SCRIPT with the official client against the cluster.
  static void RunNodeScript(const std::string& script) {
    const std::string cmd = std::string("NODE_PATH=") + FLOTILLA_NODE_MODULES + " " +
                            FLOTILLA_NODE + " " + FLOTILLA_HTTP_TEST_DIR + "/" + script +
                            " http://" + cluster_->http_address() + "/v1 " + Model();
    const auto [rc, out] = testing_util::RunCommandWithStderr(cmd);
    EXPECT_EQ(rc, 0) << out;
    EXPECT_NE(out.find("all ok"), std::string::npos) << out;
  }
};

TEST_F(HttpApiTest, OfficialOpenAiClient) { RunNodeScript("openai_client_test.js"); }

// Structured outputs (response_format, required tool calls, unsupported
// schema features) and logit_bias, through the official client.
TEST_F(HttpApiTest, StructuredOutputsOfficialClient) { RunNodeScript("structured_client_test.js"); }

// Completions n (streamed and not, the prompt's KV shared), echo, token-id and
// batched prompts, and their 400s, through the official client.
TEST_F(HttpApiTest, CompletionsChoicesAndPromptsOfficialClient) {
  RunNodeScript("completions_client_test.js");
}

// POST /v1/responses: whole and streamed, reasoning items, a function-tool
// round trip with and without the store, errors; through the official client.
TEST_F(HttpApiTest, ResponsesOfficialClient) { RunNodeScript("responses_client_test.js"); }

// The Responses lifecycle: retrieve, delete, background responses polled and
// cancelled, encrypted reasoning passed back; through the official client.
TEST_F(HttpApiTest, ResponsesLifecycleOfficialClient) { RunNodeScript("responses_lifecycle_test.js"); }

// The request field policy (extras accepted and acted on, unknown fields
// named in a header), reasoning in both members, and forced calls cut by the
// token limit answered "length" / "incomplete"; through the official client.
TEST_F(HttpApiTest, RequestFieldsAndFinishReasonsOfficialClient) {
  RunNodeScript("request_fields_client_test.js");
}

// The official agent and framework clients: the OpenAI Agents SDK (both model
// classes), the Vercel AI SDK and LangChain JS, each with tool round trips,
// structured outputs and a zod .email() tool parameter.
TEST_F(HttpApiTest, AgentsSdkClient) { RunNodeScript("agents_client_test.js"); }
TEST_F(HttpApiTest, VercelAiSdkClient) { RunNodeScript("ai_sdk_client_test.js"); }
TEST_F(HttpApiTest, LangChainClient) { RunNodeScript("langchain_client_test.js"); }

TEST_F(HttpApiTest, HealthAndMetrics) {
  auto c = Client();
  auto h = c.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200) << h->body;
  auto r = c.Post("/v1/chat/completions", Chat(R"(, "max_tokens": 4, "temperature": 0)"), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  // A request is counted once its response is written (the server's logger
  // runs after the write), so the client may ask before that: ask again.
  const std::string counted = "flotilla_http_requests_total{model_name=\"" + Model() +
                              "\",path=\"/v1/chat/completions\",status=\"200\"}";
  auto m = c.Get("/metrics");
  for (int i = 0; i < 100 && m && m->body.find(counted) == std::string::npos; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    m = c.Get("/metrics");
  }
  ASSERT_TRUE(m);
  EXPECT_EQ(m->status, 200);
  // Every series names the model (model_name, as vLLM's do); the request
  // series also their instance.
  const std::string model = "model_name=\"" + Model() + "\"";
  const std::string of_instance = model + ",instance=\"0\"";
  for (const std::string& name :
       {counted, "flotilla_prompt_tokens_total{" + of_instance + "}",
        "flotilla_generation_tokens_total{" + of_instance + "}",
        "flotilla_time_to_first_token_seconds_bucket{" + of_instance + ",le=\"+Inf\"}",
        "flotilla_inter_token_latency_seconds_count{" + of_instance + "}",
        "flotilla_running_sequences{" + model + "}", "flotilla_queued_sequences{" + model + "}",
        "flotilla_kv_cache_usage_ratio{" + model + "}",
        "flotilla_instance_ready{" + of_instance + "} 1",
        // Finish reasons; queue, prefill and decode times (buckets up to 30 minutes).
        "flotilla_requests_finished_total{" + of_instance + ",finished_reason=\"length\"}",
        "flotilla_request_queue_time_seconds_bucket{" + of_instance + ",le=\"1800\"} ",
        "flotilla_request_prefill_time_seconds_count{" + of_instance + "}",
        "flotilla_request_decode_time_seconds_sum{" + of_instance + "}",
        "flotilla_time_to_first_token_seconds_bucket{" + of_instance + ",le=\"1800\"}",
        "flotilla_request_duration_seconds_bucket{" + of_instance + ",le=\"1800\"}"}) {
    EXPECT_NE(m->body.find(name), std::string::npos) << name << "\n" << m->body;
  }
  std::smatch g;
  ASSERT_TRUE(std::regex_search(m->body, g, std::regex("flotilla_generation_tokens_total\\{[^}]*\\} (\\d+)")));
  EXPECT_GE(std::stoull(g[1]), Json::parse(r->body)["usage"]["completion_tokens"].get<uint64_t>());
}

TEST_F(HttpApiTest, ErrorsHaveTheOpenAiShape) {
  auto c = Client();
  struct Case {
    const char* method;
    std::string path, body;
    int status;
    const char* param;
  } cases[] = {
      {"POST", "/v1/chat/completions", "{\"model\": ", 400, nullptr},
      {"POST", "/v1/chat/completions", "[]", 400, nullptr},
      {"POST", "/v1/chat/completions", "\"\xff\xfe\"", 400, nullptr},
      {"POST", "/v1/chat/completions", Chat(R"(, "n": 17)"), 400, "n"},
      {"POST", "/v1/chat/completions", Chat(R"(, "temperature": -1)"), 400, "temperature"},
      {"POST", "/v1/chat/completions", Chat(R"(, "tools": 5)"), 400, "tools"},
      {"POST", "/v1/chat/completions", R"({"model": "nope", "messages": []})", 404, "model"},
      {"POST", "/v1/completions", R"({"model": ")" + Model() + R"("})", 400, "prompt"},
      {"GET", "/v1/nothing", "", 404, nullptr},
      {"GET", "/v1/models/nope", "", 404, "model"},
  };
  for (const Case& k : cases) {
    auto r = std::string(k.method) == "GET" ? c.Get(k.path.c_str())
                                            : c.Post(k.path.c_str(), k.body, "application/json");
    ASSERT_TRUE(r) << k.path;
    EXPECT_EQ(r->status, k.status) << k.body << " -> " << r->body;
    Json j = Json::parse(r->body, nullptr, false);
    ASSERT_TRUE(j.is_object() && j.contains("error")) << r->body;
    EXPECT_TRUE(j["error"]["message"].is_string() && !j["error"]["message"].get<std::string>().empty());
    EXPECT_TRUE(j["error"]["type"].is_string());
    if (k.param) {
      EXPECT_EQ(j["error"]["param"], k.param) << r->body;
    }
  }
  // The server is still fine.
  auto h = c.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
}

TEST_F(HttpApiTest, StopStringsAndMaxTokens) {
  auto c = Client();
  auto whole = c.Post("/v1/completions",
                      R"({"model": ")" + Model() + R"(", "prompt": "hello", "max_tokens": 12, "temperature": 0})",
                      "application/json");
  ASSERT_TRUE(whole);
  ASSERT_EQ(whole->status, 200) << whole->body;
  Json w = Json::parse(whole->body);
  EXPECT_EQ(w["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(w["usage"]["completion_tokens"], 12);
  const std::string text = w["choices"][0]["text"];
  ASSERT_GE(text.size(), 4u);
  // Stop at a piece of the greedy text: the answer is what came before it.
  const std::string stop = text.substr(text.size() / 2, 2);
  const std::string before = text.substr(0, text.find(stop));
  Json req = {{"model", Model()}, {"prompt", "hello"}, {"max_tokens", 12}, {"temperature", 0}, {"stop", {stop}}};
  auto cut = c.Post("/v1/completions", req.dump(), "application/json");
  ASSERT_TRUE(cut);
  Json s = Json::parse(cut->body);
  EXPECT_EQ(s["choices"][0]["text"], before);
  EXPECT_EQ(s["choices"][0]["finish_reason"], "stop");
}

TEST_F(HttpApiTest, DisconnectMidStreamCancels) {
  ASSERT_TRUE(WaitIdle());
  const double generated = Metric("flotilla_generation_tokens_total");
  // A long stream, dropped after the first event: the sequence must go away.
  {
    auto c = Client();
    bool got = false;
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/chat/completions";
    req.set_header("Content-Type", "application/json");
    req.body = Chat(R"(, "max_tokens": 4000, "temperature": 1, "stream": true)");
    req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) {
      got = true;
      return false;  // abort the connection
    };
    c.send(req);
    EXPECT_TRUE(got);
  }
  auto c = Client();
  bool released = false;
  for (int i = 0; i < 100 && !released; ++i) {
    auto m = c.Get("/metrics");
    ASSERT_TRUE(m);
    released = std::regex_search(m->body, std::regex("\nflotilla_http_requests_in_flight\\{[^}]*\\} 0\n"));
    if (!released) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(released) << "the dropped stream is still counted in flight";
  // Cancelled: the worker no longer runs its sequence, so no more tokens
  // come of it (it asked for 4000).
  ASSERT_TRUE(WaitIdle()) << "the dropped stream's sequence is still generating";
  EXPECT_LT(Metric("flotilla_generation_tokens_total") - generated, 3000);
}

TEST_F(HttpApiTest, WholeResponseClientGoneCancels) {
  const double cancelled = Metric("flotilla_requests_cancelled_total");
  ASSERT_GE(cancelled, 0);
  {
    // Not streamed, up to the context length (a fixed seed: an unseeded draw
    // may sample a stop token within a few tokens); the client gives up
    // after 0.5 s.
    httplib::Client impatient("http://" + cluster_->http_address());
    impatient.set_read_timeout(0, 500000);
    auto r = impatient.Post("/v1/chat/completions", Chat(R"(, "temperature": 1, "seed": 7)"),
                            "application/json");
    EXPECT_FALSE(r) << "expected the client to time out";
  }
  EXPECT_TRUE(WaitIdle()) << "the abandoned request still runs";
  EXPECT_GE(Metric("flotilla_requests_cancelled_total"), cancelled + 1);
}

TEST_F(HttpApiTest, RequestDeadlineHeader) {
  auto c = Client();
  httplib::Headers late = {{"X-Request-Timeout", "1"}};
  auto r = c.Post("/v1/chat/completions", late, Chat(R"(, "temperature": 1, "seed": 7)"),
                  "application/json");
  ExpectTimedOut(r);
  // The official clients' header works the same; a bad value is a 400.
  auto ok = c.Post("/v1/chat/completions", httplib::Headers{{"X-Stainless-Timeout", "600"}},
                   Chat(R"(, "max_tokens": 2)"), "application/json");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200) << ok->body;
  auto bad = c.Post("/v1/chat/completions", httplib::Headers{{"X-Request-Timeout", "soon"}},
                    Chat(R"(, "max_tokens": 2)"), "application/json");
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400) << bad->body;
}

// /v1/responses on the chat route's model: named SSE events; a dropped
// stream cancels its request; X-Request-Timeout ends a whole response with 504.
TEST_F(HttpApiTest, ResponsesStreamDisconnectAndDeadline) {
  // A fixed seed: an unseeded draw may sample a stop token within a few
  // tokens and finish before the deadline.
  const std::string body =
      R"({"model": ")" + Model() + R"(", "input": "Hi", "temperature": 1, "seed": 7})";
  {
    auto c = Client();
    std::string first;
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/responses";
    req.set_header("Content-Type", "application/json");
    req.body = body.substr(0, body.size() - 1) + R"(, "max_output_tokens": 4000, "stream": true})";
    req.content_receiver = [&](const char* data, size_t size, uint64_t, uint64_t) {
      first.append(data, size);
      return false;  // abort the connection
    };
    c.send(req);
    EXPECT_EQ(first.rfind("event: response.created\ndata: {", 0), 0u) << first;
  }
  auto c = Client();
  // Up to 30 s: the workers report their running sequences with their
  // heartbeats, which a loaded machine delays.
  bool released = false;
  for (int i = 0; i < 300 && !released; ++i) {
    auto m = c.Get("/metrics");
    ASSERT_TRUE(m);
    released = std::regex_search(m->body, std::regex("\nflotilla_http_requests_in_flight\\{[^}]*\\} 0\n")) &&
               std::regex_search(m->body, std::regex("\nflotilla_running_sequences\\{[^}]*\\} 0\n"));
    if (!released) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(released) << "the dropped /v1/responses stream still runs";

  auto r = c.Post("/v1/responses", httplib::Headers{{"X-Request-Timeout", "1"}}, body, "application/json");
  ExpectTimedOut(r);

  // Streamed, the deadline ends the stream with an `error` event.
  auto streamed = c.Post("/v1/responses", httplib::Headers{{"X-Request-Timeout", "1"}},
                         body.substr(0, body.size() - 1) + R"(, "stream": true})", "application/json");
  ASSERT_TRUE(streamed);
  EXPECT_EQ(streamed->status, 200);
  const size_t error = streamed->body.rfind("event: error\ndata: ");
  ASSERT_NE(error, std::string::npos) << streamed->body.substr(0, 2000);
  EXPECT_NE(streamed->body.find("deadline", error), std::string::npos) << streamed->body.substr(error);
  EXPECT_EQ(streamed->body.find("response.completed"), std::string::npos);
}

}  // namespace
}  // namespace flotilla
