// The HTTP API under hostile load, context-length errors and what operators
// read (JSON logs with process tags, the access log), end to end on a
// LocalCluster (real coordinator and worker processes, default synthetic
// model, 4096-token context).
//
// With 100 slow-header and 500 idle connections open a request and /health
// are answered at all (a server that waited on them would answer neither);
// /health with 128 streams open is the one latency check (label slow,
// generous bounds).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "tests/local_cluster_suite.h"
#include "tools/sdk/client.h"

namespace flotilla {
namespace {

using Json = nlohmann::json;
using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

double MsSince(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// A raw connection: connected, maybe sent something, held open.
class Socket {
 public:
  explicit Socket(const std::string& host_port) {
    const size_t colon = host_port.rfind(':');
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(std::stoi(host_port.substr(colon + 1))));
    inet_pton(AF_INET, host_port.substr(0, colon).c_str(), &a.sin_addr);
    ok_ = connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  }
  Socket(Socket&& o) noexcept : fd_(o.fd_), ok_(o.ok_) { o.fd_ = -1; }
  Socket(const Socket&) = delete;
  ~Socket() {
    if (fd_ >= 0) close(fd_);
  }
  bool ok() const { return ok_; }
  bool Send(const std::string& s) {
    return ::send(fd_, s.data(), s.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(s.size());
  }
  // Reads until `want` appears (or 30 s pass).
  bool WaitFor(const std::string& want) {
    const auto end = Clock::now() + std::chrono::seconds(30);
    while (in_.find(want) == std::string::npos && Clock::now() < end) {
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, 1000) <= 0) continue;
      char buf[4096];
      const ssize_t n = recv(fd_, buf, sizeof(buf), 0);
      if (n <= 0) return false;
      in_.append(buf, static_cast<size_t>(n));
    }
    return in_.find(want) != std::string::npos;
  }

 private:
  int fd_ = -1;
  bool ok_ = false;
  std::string in_;
};

void RaiseDescriptorLimit() {
  rlimit r{};
  getrlimit(RLIMIT_NOFILE, &r);
  r.rlim_cur = r.rlim_max;
  setrlimit(RLIMIT_NOFILE, &r);
}

class HttpServingTest : public testing_util::LocalClusterSuite<HttpServingTest> {
 public:
  static void Configure(cli::LocalClusterOptions& o) {
    setenv("FLOTILLA_ACCESS_LOG_IDS", "1", 1);  // the access-line test finds its line by id
    RaiseDescriptorLimit();
    log_dir_ = new std::string(fs::temp_directory_path() /
                               ("flotilla-http-serving-" + std::to_string(getpid())));
    fs::create_directories(*log_dir_);
    o.log_dir = *log_dir_;
    o.log_format = "json";
  }
  static void TearDownTestSuite() {
    LocalClusterSuite::TearDownTestSuite();
    if (::testing::UnitTest::GetInstance()->failed_test_count() > 0) {
      for (const char* name : {"coordinator", "worker-0"}) {
        std::ifstream in(*log_dir_ + "/" + name + ".log");
        std::vector<std::string> lines;
        for (std::string line; std::getline(in, line);) {
          if (line.find("\"access\"") == std::string::npos) lines.push_back(line);
        }
        std::cout << "---- the end of " << name << ".log (access lines left out)\n";
        for (size_t i = lines.size() > 40 ? lines.size() - 40 : 0; i < lines.size(); ++i) {
          std::cout << lines[i] << "\n";
        }
      }
    }
    fs::remove_all(*log_dir_);
    delete log_dir_;
  }

 protected:
  static httplib::Client Client() {
    httplib::Client c("http://" + cluster_->http_address());
    c.set_read_timeout(60, 0);
    return c;
  }
  // The coordinator's (or a worker's) log, one JSON object a line.
  static std::vector<Json> LogLines(const std::string& name) {
    std::vector<Json> out;
    std::ifstream in(*log_dir_ + "/" + name + ".log");
    std::string line;
    while (std::getline(in, line)) out.push_back(Json::parse(line, nullptr, false));
    return out;
  }
  static inline std::string* log_dir_ = nullptr;
};

// ~100 KB bodies nested ~50,000 levels deep (the probe's crash): every route
// and JSON-carrying field answers a clean 400 naming the nesting, and the
// coordinator stays up and serves the next request.
TEST_F(HttpServingTest, DeeplyNestedJsonIsRefusedOnEveryRoute) {
  const int depth = 50000;
  const std::string arrays = std::string(depth, '[') + std::string(depth, ']');
  std::string objects;
  for (int i = 0; i < depth / 3; ++i) objects += "{\"a\":";
  objects += "1" + std::string(depth / 3, '}');
  const std::string model = "\"model\": \"" + Model() + "\"";
  const std::string user = "[{\"role\": \"user\", \"content\": \"x\"}]";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"/v1/chat/completions", "{" + model + ", \"messages\": " + user + ", \"metadata\": " + objects + "}"},
      {"/v1/chat/completions", "{" + model + ", \"messages\": " + arrays + "}"},
      {"/v1/chat/completions",
       "{" + model + ", \"messages\": " + user +
           ", \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", "
           "\"parameters\": " + objects + "}}]}"},
      {"/v1/chat/completions",
       "{" + model + ", \"messages\": " + user +
           ", \"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"name\": "
           "\"x\", \"schema\": " + objects + "}}}"},
      {"/v1/completions", "{" + model + ", \"prompt\": " + arrays + "}"},
      {"/v1/responses", "{" + model + ", \"input\": " + arrays + "}"},
      {"/v1/responses", "{" + model + ", \"input\": \"x\", \"metadata\": " + objects + "}"},
      {"/tokenize", "{\"prompt\": " + arrays + "}"},
      {"/tokenize", "{\"messages\": " + arrays + "}"},
      {"/detokenize", "{\"tokens\": " + arrays + "}"},
      {"/v1/chat/completions", std::string(1 << 20, '[')},  // unclosed, 1 MiB
  };
  auto c = Client();
  for (const auto& [path, body] : cases) {
    SCOPED_TRACE(path + " with " + body.substr(0, 60) + "...");
    auto res = c.Post(path, body, "application/json");
    ASSERT_TRUE(res) << "no answer: the coordinator is down";
    EXPECT_EQ(res->status, 400) << res->body;
    const Json error = Json::parse(res->body, nullptr, false);
    ASSERT_TRUE(error.is_object()) << res->body;
    EXPECT_NE(error["error"]["message"].get<std::string>().find("nested more than 64 levels"),
              std::string::npos)
        << res->body;
  }
  auto ok = c.Post("/v1/completions",
                   R"({"model": ")" + Model() + R"(", "prompt": "hi", "max_tokens": 2})",
                   "application/json");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200) << ok->body;
}

// The same through gRPC Chat's JSON-carrying fields: INVALID_ARGUMENT naming
// the field; Generate's sampling fields are checked whatever the instance's state.
TEST_F(HttpServingTest, DeeplyNestedGrpcJsonFieldsAreInvalidArgument) {
  client::ClientOptions o;
  o.address = cluster_->address();
  auto sdk = client::Client::Create(o);
  ASSERT_TRUE(sdk.ok());
  const std::string arrays = std::string(50000, '[') + std::string(50000, ']');
  v1::ChatRequest tools;
  *tools.add_messages() = client::MakeChatMessage(v1::ChatMessage::USER, "Hi");
  v1::Tool* tool = tools.add_tools();
  tool->set_name("f");
  tool->set_parameters_json("{\"a\": " + arrays + "}");
  absl::StatusOr<client::ChatResult> got = (*sdk)->Chat(tools);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << got.status();
  EXPECT_NE(got.status().message().find("tools[0].parameters_json"), std::string::npos)
      << got.status();
  v1::ChatRequest schema;
  *schema.add_messages() = client::MakeChatMessage(v1::ChatMessage::USER, "Hi");
  schema.mutable_response_format()->set_type(v1::ResponseFormat::JSON_SCHEMA);
  schema.mutable_response_format()->mutable_json_schema()->set_schema_json(arrays);
  got = (*sdk)->Chat(schema);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << got.status();
  EXPECT_NE(got.status().message().find("nested more than 64 levels"), std::string::npos)
      << got.status();
  v1::GenerateRequest g;
  g.mutable_prompt_ids()->add_ids(1);
  g.mutable_sampling()->set_top_p(7);
  auto generated = (*sdk)->Generate(g);
  EXPECT_EQ(generated.status().code(), absl::StatusCode::kInvalidArgument) << generated.status();
  EXPECT_NE(generated.status().message().find("sampling.top_p"), std::string::npos);
  EXPECT_TRUE((*sdk)->ListModels().ok());
}

TEST_F(HttpServingTest, SlowHeadersAndIdleConnectionsDoNotDelayARequest) {
  std::vector<Socket> hogs;
  for (int i = 0; i < 500; ++i) {
    hogs.emplace_back(cluster_->http_address());
    ASSERT_TRUE(hogs.back().ok()) << "idle connection " << i;
  }
  for (int i = 0; i < 100; ++i) {
    hogs.emplace_back(cluster_->http_address());
    ASSERT_TRUE(hogs.back().ok()) << "slow connection " << i;
    // A head that never ends (slowloris).
    ASSERT_TRUE(hogs.back().Send(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"));
  }
  // The hogs stay open and never finish a head: a server that waited on
  // them would answer neither request.
  auto c = Client();
  auto r = c.Post("/v1/completions",
                  R"({"model": ")" + Model() + R"(", "prompt": "hello", "max_tokens": 4})",
                  "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  auto h = c.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  EXPECT_GE(Metric("flotilla_http_connections"), 600);
}

TEST_F(HttpServingTest, HealthAnswersFastWith128StreamsOpen) {
  // 128 x 401 tokens fit the worker's KV cache (64 Ki tokens): every stream generates at once.
  std::vector<Socket> streams;
  const std::string body =
      R"({"model": ")" + Model() +
      R"(", "prompt": "hello", "max_tokens": 400, "temperature": 1, "stream": true})";
  for (int i = 0; i < 128; ++i) {
    streams.emplace_back(cluster_->http_address());
    ASSERT_TRUE(streams.back().ok());
    ASSERT_TRUE(
        streams.back().Send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                            "application/json\r\nContent-Length: " +
                            std::to_string(body.size()) + "\r\n\r\n" + body));
  }
  for (Socket& s : streams) ASSERT_TRUE(s.WaitFor("data: ")) << "a stream did not start";
  EXPECT_GE(Metric("flotilla_http_requests_in_flight"), 120);
  std::vector<double> ms;
  for (int i = 0; i < 11; ++i) {
    const auto start = Clock::now();
    httplib::Client c("http://" + cluster_->http_address());
    auto h = c.Get("/health");
    ms.push_back(MsSince(start));
    ASSERT_TRUE(h);
    EXPECT_EQ(h->status, 200);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::sort(ms.begin(), ms.end());
  std::cout << "/health with 128 streams open: median " << ms[ms.size() / 2] << " ms, max "
            << ms.back() << " ms\n";
  // Latency is the point here (label slow): bounds generous for a loaded CI
  // machine, far below what waiting behind 128 generating streams costs.
  EXPECT_LT(ms[ms.size() / 2], 250.0);
  EXPECT_LT(ms.back(), 2000.0);
  streams.clear();  // the clients go away: their requests are cancelled
  EXPECT_TRUE(WaitIdle());
}

TEST_F(HttpServingTest, ContextLengthErrorsLikeVllm) {
  auto c = Client();
  // Chat: prompt + max_tokens over the 4096-token context.
  auto r = c.Post("/v1/chat/completions",
                  R"({"model": ")" + Model() +
                      R"(", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5000})",
                  "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400) << r->body;
  Json e = Json::parse(r->body)["error"];
  EXPECT_EQ(e["code"], "context_length_exceeded") << r->body;
  EXPECT_EQ(e["param"], "messages") << r->body;
  EXPECT_EQ(e["type"], "invalid_request_error");
  const std::string message = e["message"];
  EXPECT_NE(message.find("maximum context length is 4096 tokens"), std::string::npos) << message;
  EXPECT_NE(message.find("5000 in the completion"), std::string::npos) << message;
  // Completions name the prompt.
  r = c.Post("/v1/completions",
             R"({"model": ")" + Model() + R"(", "prompt": "hello", "max_tokens": 4096})",
             "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400) << r->body;
  EXPECT_EQ(Json::parse(r->body)["error"]["param"], "prompt") << r->body;
  EXPECT_EQ(Json::parse(r->body)["error"]["code"], "context_length_exceeded") << r->body;
  // Asked to be truncated: served, the prompt cut to its last 4090 tokens and
  // the completion to the 6 left.
  std::string long_prompt;
  for (int i = 0; i < 5000; ++i) long_prompt += " hello";
  r = c.Post("/v1/completions",
             R"({"model": ")" + Model() + R"(", "prompt": ")" + long_prompt +
                 R"(", "max_tokens": 100, "truncate_prompt_tokens": 4090, "temperature": 0})",
             "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const Json ok = Json::parse(r->body);
  EXPECT_EQ(ok["usage"]["prompt_tokens"], 4090) << r->body;
  EXPECT_LE(ok["usage"]["completion_tokens"].get<int>(), 6) << r->body;
  // gRPC: INVALID_ARGUMENT with the same message.
  client::ClientOptions o;
  o.address = cluster_->address();
  auto sdk = client::Client::Create(o);
  ASSERT_TRUE(sdk.ok()) << sdk.status();
  v1::GenerateRequest g;
  for (int t : {1, 2, 3}) g.mutable_prompt_ids()->add_ids(t);
  g.mutable_sampling()->set_max_tokens(5000);
  auto res = (*sdk)->Generate(g);
  EXPECT_EQ(res.status().code(), absl::StatusCode::kInvalidArgument) << res.status();
  EXPECT_NE(
      res.status().message().find("However, you requested 5003 tokens (3 in the messages, 5000 in "
                                  "the completion)"),
      std::string::npos)
      << res.status();
}

TEST_F(HttpServingTest, LogsAreJsonWithProcessTagsAndOneAccessLineARequest) {
  auto c = Client();
  auto r = c.Post(
      "/v1/completions",
      R"({"model": ")" + Model() + R"(", "prompt": "hello", "max_tokens": 3, "temperature": 0,
          "guided_choice": ["a"]})",
      "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(r->get_header_value("x-flotilla-ignored-fields"), "guided_choice");
  const std::string id = Json::parse(r->body)["id"];
  // A forced function call: the access line says tool_calls, as the answer does.
  auto call = c.Post("/v1/chat/completions", R"({"model": ")" + Model() + R"(",
      "messages": [{"role": "user", "content": "Weather?"}], "max_tokens": 200, "temperature": 0,
      "tool_choice": "required", "tools": [{"type": "function", "function": {"name": "w",
      "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}},
      "required": ["city"], "additionalProperties": false}}}]})",
                  "application/json");
  ASSERT_TRUE(call);
  ASSERT_EQ(call->status, 200) << call->body;
  const Json call_json = Json::parse(call->body);
  ASSERT_EQ(call_json["choices"][0]["finish_reason"], "tool_calls") << call->body;
  const std::string call_id = call_json["id"];
  client::ClientOptions o;
  o.address = cluster_->address();
  auto sdk = client::Client::Create(o);
  ASSERT_TRUE(sdk.ok());
  v1::GenerateRequest g;
  for (int t : {1, 2, 3}) g.mutable_prompt_ids()->add_ids(t);
  g.mutable_sampling()->set_max_tokens(2);
  ASSERT_TRUE((*sdk)->Generate(g).ok());

  Json http_line, grpc_line, call_line, ignored_line;
  for (int i = 0; i < 100 && (http_line.is_null() || grpc_line.is_null() || call_line.is_null());
       ++i) {
    for (const Json& line : LogLines("coordinator")) {
      ASSERT_TRUE(line.is_object()) << "a coordinator log line is not JSON";
      EXPECT_EQ(line["process"], "coordinator") << line;
      EXPECT_TRUE(line.contains("time") && line.contains("level") && line.contains("msg")) << line;
      if (line["msg"].get<std::string>().find("ignored request fields") != std::string::npos) {
        ignored_line = line;
      }
      if (line["msg"] != "access") continue;
      if (line["request_id"] == id) http_line = line;
      if (line["request_id"] == call_id) call_line = line;
      if (line["api"] == "grpc Generate") grpc_line = line;
    }
    if (http_line.is_null() || grpc_line.is_null())
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_FALSE(http_line.is_null()) << "no access line for " << id;
  EXPECT_EQ(http_line["api"], "POST /v1/completions");
  EXPECT_EQ(http_line["status"], "200");
  EXPECT_EQ(http_line["output_tokens"], 3);
  EXPECT_GT(http_line["prompt_tokens"].get<int>(), 0);
  EXPECT_TRUE(http_line["ttft_ms"].is_number()) << http_line;
  EXPECT_TRUE(http_line["duration_ms"].is_number()) << http_line;
  EXPECT_EQ(http_line["finish_reason"], "length");
  ASSERT_FALSE(call_line.is_null()) << "no access line for " << call_id;
  EXPECT_EQ(call_line["finish_reason"], "tool_calls");
  ASSERT_FALSE(ignored_line.is_null()) << "no log line naming the ignored field";
  EXPECT_EQ(ignored_line["level"], "warning");
  EXPECT_EQ(ignored_line["msg"],
            "/v1/completions: ignored request fields this server does not know: guided_choice");
  EXPECT_TRUE(http_line.contains("key"));
  ASSERT_FALSE(grpc_line.is_null());
  EXPECT_EQ(grpc_line["status"], "OK");
  EXPECT_EQ(grpc_line["output_tokens"], 2);
  EXPECT_EQ(grpc_line["prompt_tokens"], 3);
  const std::vector<Json> worker = LogLines("worker-0");
  ASSERT_FALSE(worker.empty());
  for (const Json& line : worker) {
    ASSERT_TRUE(line.is_object());
    EXPECT_EQ(line["process"], "worker-0") << line;
  }
}

// The coordinator's field flags as `flotilla up` passes them:
// --strict-request-fields refuses an unknown field with a 400 naming it, and
// --reasoning-field reasoning leaves reasoning_content out.
TEST(RequestFieldFlags, StrictFieldsAndTheReasoningMember) {
  setenv("FLOTILLA_BIN_DIR", FLOTILLA_BIN_DIR, 1);
  cli::LocalClusterOptions o;
  o.workers = 1;
  o.threads_per_worker = 1;
  o.coordinator_args = {"--strict-request-fields", "--reasoning-field", "reasoning"};
  auto cluster = cli::LocalCluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  httplib::Client c("http://" + (*cluster)->http_address());
  c.set_read_timeout(120, 0);
  const std::string model = (*cluster)->model_id();
  auto refused = c.Post("/v1/chat/completions", R"({"model": ")" + model + R"(",
      "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "guided_json": {}})",
                        "application/json");
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 400) << refused->body;
  EXPECT_EQ(Json::parse(refused->body)["error"]["param"], "guided_json") << refused->body;
  // "analysis" (35644) at +100 opens an analysis message; the schema closes it.
  auto r = c.Post("/v1/chat/completions", R"({"model": ")" + model + R"(",
      "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 64, "temperature": 0,
      "logit_bias": {"35644": 100}, "prompt_cache_key": "k", "response_format": {"type": "json_schema",
      "json_schema": {"name": "a", "schema": {"type": "object", "properties": {"a": {"type": "integer"}},
      "required": ["a"], "additionalProperties": false}}}})",
                  "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const Json message = Json::parse(r->body)["choices"][0]["message"];
  EXPECT_TRUE(message.contains("reasoning")) << message;
  EXPECT_FALSE(message.contains("reasoning_content")) << message;
}

TEST(Binaries, VersionAndLogFlags) {
  for (const char* bin : {"flotilla", "flotilla-coordinator", "flotilla-worker"}) {
    const std::string cmd = std::string(FLOTILLA_BIN_DIR) + "/" + bin + " --version 2>&1";
    FILE* p = popen(cmd.c_str(), "r");
    ASSERT_NE(p, nullptr);
    char buf[256] = {};
    const size_t n = fread(buf, 1, sizeof(buf) - 1, p);
    EXPECT_EQ(pclose(p), 0) << bin;
    EXPECT_EQ(std::string(buf, n).rfind(std::string(bin) + " 0.", 0), 0u) << buf;
  }
  const std::string bad =
      std::string("timeout 20 ") + FLOTILLA_BIN_DIR +
      "/flotilla-coordinator --model synthetic:tiny --log-format yaml >/dev/null 2>&1";
  EXPECT_NE(std::system(bad.c_str()), 0) << "--log-format yaml was accepted";
}

}  // namespace
}  // namespace flotilla
