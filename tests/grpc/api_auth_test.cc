// API keys end to end: a LocalCluster whose coordinator has client and admin
// key files and an open /metrics listener. Covers the gRPC client and admin
// APIs (UNAUTHENTICATED / PERMISSION_DENIED), request ownership for Cancel,
// random request ids, the HTTP API (401 with an OpenAI error body), the open
// probes (/health, gRPC health, --metrics-listen), and the SDK and CLI keys.
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <bitset>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "proto/admin.grpc.pb.h"
#include "tests/grpc_stub.h"
#include "tests/local_cluster_suite.h"
#include "tests/run_command.h"
#include "tools/sdk/client.h"

namespace flotilla {
namespace {

constexpr char kAlice[] = "alice-key-0123456789";
constexpr char kBob[] = "bob-key-9876543210";
constexpr char kAdmin[] = "admin-key-abcdefabcdef";

std::string TempDir() {
  static const std::string dir = [] {
    std::string t = ::testing::TempDir() + "/flotilla-auth-XXXXXX";
    return std::string(mkdtemp(t.data()));
  }();
  return dir;
}

// Runs `cmd`, returns its exit status and stdout+stderr.
std::pair<int, std::string> RunWithStderr(const std::string& cmd) {
  return flotilla::testing_util::RunCommandWithStderr(cmd);
}

// `key` as an HTTP client sends it.
httplib::Headers KeyHeaders(const std::string& key) {
  return {{"Authorization", std::string("Bearer ") + key}};
}

// The admin key as an HTTP client sends it.
httplib::Headers AdminHeaders() { return KeyHeaders(kAdmin); }

// GETs `path` with `headers` and expects `status`: the body ("" when no
// answer came, a test failure too).
std::string Body(httplib::Client& http, const std::string& path, const httplib::Headers& headers,
                 int status) {
  auto res = http.Get(path, headers);
  if (!res) {
    ADD_FAILURE() << path << ": no answer";
    return "";
  }
  EXPECT_EQ(res->status, status) << path << ": " << res->body;
  return res->body;
}

class ApiAuthTest : public testing_util::LocalClusterSuite<ApiAuthTest> {
 public:
  static void Configure(cli::LocalClusterOptions& o) {
    unsetenv("FLOTILLA_API_KEY");
    const std::string dir = TempDir();
    std::ofstream(dir + "/api-keys") << "# clients\n" << kAlice << "\n\n" << kBob << "\n";
    std::ofstream(dir + "/admin-keys") << kAdmin << "\n";
    o.api_key_file = dir + "/api-keys";
    o.admin_key_file = dir + "/admin-keys";
    o.coordinator_args = {"--metrics-listen", "127.0.0.1:0", "--metrics-port-file",
                          dir + "/metrics-port"};
  }
  static void SetUpTestSuite() {
    LocalClusterSuite::SetUpTestSuite();
    std::ifstream(TempDir() + "/metrics-port") >> metrics_port_;
  }
  // /metrics without a key: the --metrics-listen listener.
  static std::string MetricsAddress() { return "127.0.0.1:" + std::to_string(metrics_port_); }
  using LocalClusterSuite::WaitIdle;  // for CachedTokensOf

 protected:
  static std::unique_ptr<client::Client> Sdk(const std::string& key) {
    client::ClientOptions o;
    o.address = cluster_->address();
    o.deadline = absl::Minutes(2);
    o.api_key = key;
    auto c = client::Client::Create(o);
    EXPECT_TRUE(c.ok()) << c.status();
    return *std::move(c);
  }
  static std::unique_ptr<admin::Admin::Stub> Admin() {
    return testing_util::PlainStub<admin::Admin>(cluster_->address());
  }
  static void Key(grpc::ClientContext& ctx, const std::string& key) {
    if (!key.empty()) ctx.AddMetadata("authorization", "Bearer " + key);
  }
  // A unary call of `method` with `bytes` as its request, whatever they are
  // (no protobuf on this side), sent with `key` (empty: none): the status,
  // and the response's bytes in `*response` when given.
  static grpc::Status RawCall(const std::string& method, const std::string& bytes,
                              const std::string& key, std::string* response = nullptr) {
    grpc::GenericStub stub(
        grpc::CreateChannel(cluster_->address(), grpc::InsecureChannelCredentials()));
    grpc::CompletionQueue cq;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    Key(ctx, key);
    grpc::Slice slice(bytes);
    grpc::ByteBuffer request(&slice, 1);
    auto rpc = stub.PrepareUnaryCall(&ctx, method, request, &cq);
    rpc->StartCall();
    grpc::ByteBuffer answer;
    grpc::Status status;
    rpc->Finish(&answer, &status, reinterpret_cast<void*>(1));
    void* tag = nullptr;
    bool ok = false;
    EXPECT_TRUE(cq.Next(&tag, &ok));
    if (response != nullptr && status.ok()) {
      std::vector<grpc::Slice> slices;
      EXPECT_TRUE(answer.Dump(&slices).ok());
      for (const grpc::Slice& s : slices) {
        response->append(reinterpret_cast<const char*>(s.begin()), s.size());
      }
    }
    return status;
  }
  // Admin call `rpc` with `request`, sent with `key` (empty: none).
  template <typename Request, typename Response>
  static grpc::Status AdminCall(const std::string& key,
                                grpc::Status (admin::Admin::Stub::*rpc)(grpc::ClientContext*,
                                                                        const Request&, Response*),
                                const Request& request, Response* response) {
    grpc::ClientContext ctx;
    Key(ctx, key);
    return (Admin().get()->*rpc)(&ctx, request, response);
  }
  static v1::GenerateRequest Prompt(uint32_t max_tokens) {
    v1::GenerateRequest r;
    for (int id : {1, 2, 3}) r.mutable_prompt_ids()->add_ids(id);
    r.mutable_sampling()->set_max_tokens(max_tokens);
    r.mutable_sampling()->set_ignore_eos(true);
    return r;
  }
  static inline int metrics_port_ = 0;
};

TEST_F(ApiAuthTest, GrpcWithoutAValidKeyIsUnauthenticated) {
  for (const std::string key : {"", "not-a-key", "alice-key"}) {
    auto c = Sdk(key);
    absl::StatusOr<client::GenerateResult> g = c->Generate(Prompt(2));
    EXPECT_EQ(g.status().code(), absl::StatusCode::kUnauthenticated) << key << ": " << g.status();
    v1::ChatRequest chat;
    *chat.add_messages() = client::MakeChatMessage(v1::ChatMessage::USER, "Hi");
    EXPECT_EQ(c->Chat(chat).status().code(), absl::StatusCode::kUnauthenticated);
    EXPECT_EQ(c->ListModels().status().code(), absl::StatusCode::kUnauthenticated);
    EXPECT_EQ(c->Cancel("0123").status().code(), absl::StatusCode::kUnauthenticated);
    admin::ClusterStatus s;
    EXPECT_EQ(
        AdminCall(key, &admin::Admin::Stub::GetStatus, admin::GetStatusRequest(), &s).error_code(),
        grpc::StatusCode::UNAUTHENTICATED);
  }
}

TEST_F(ApiAuthTest, GrpcWithAKeyWorks) {
  for (const std::string key : {kAlice, kBob, kAdmin}) {
    auto c = Sdk(key);
    absl::StatusOr<client::GenerateResult> g = c->Generate(Prompt(3));
    ASSERT_TRUE(g.ok()) << key << ": " << g.status();
    EXPECT_EQ(g->token_ids.size(), 3u);
    EXPECT_TRUE(c->ListModels().ok());
    admin::ClusterStatus s;
    EXPECT_TRUE(AdminCall(key, &admin::Admin::Stub::GetStatus, admin::GetStatusRequest(), &s).ok())
        << "reads: any key";
  }
}

TEST_F(ApiAuthTest, GrpcHealthStaysOpen) {
  std::string response;
  // HealthCheckRequest{service: ""}, sent without a key.
  const grpc::Status status = RawCall("/grpc.health.v1.Health/Check", "", "", &response);
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response, std::string("\x08\x01", 2)) << "SERVING";
}

// Bytes that are no protobuf message: INVALID_ARGUMENT naming the message
// type, on the client and the admin API (gRPC itself would answer
// UNIMPLEMENTED with no message); a caller without a key is still refused first.
TEST_F(ApiAuthTest, UndecodableRequestsAreInvalidArgumentNamingTheMessage) {
  const std::string truncated("\x0a\x05" "ab", 4), garbage("\xff\xff\xff", 3);
  const std::pair<const char*, const char*> methods[] = {
      {"/flotilla.v1.Flotilla/Generate", "flotilla.v1.GenerateRequest"},
      {"/flotilla.v1.Flotilla/Chat", "flotilla.v1.ChatRequest"},
      {"/flotilla.v1.Flotilla/Cancel", "flotilla.v1.CancelRequest"},
      {"/flotilla.v1.Flotilla/ListModels", "flotilla.v1.ListModelsRequest"},
      {"/flotilla.admin.Admin/GetStatus", "flotilla.admin.GetStatusRequest"},
      {"/flotilla.admin.Admin/GetExpertLoad", "flotilla.admin.ExpertLoadRequest"},
      {"/flotilla.admin.Admin/Drain", "flotilla.admin.DrainRequest"},
  };
  for (const auto& [method, type] : methods) {
    for (const std::string& bytes : {truncated, garbage}) {
      const grpc::Status st = RawCall(method, bytes, kAdmin);
      EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << method;
      EXPECT_NE(st.error_message().find(type), std::string::npos)
          << method << ": " << st.error_message();
    }
    EXPECT_EQ(RawCall(method, garbage, "").error_code(), grpc::StatusCode::UNAUTHENTICATED)
        << method;
  }
  // Well-formed requests still work.
  admin::ClusterStatus s;
  EXPECT_TRUE(
      AdminCall(kAlice, &admin::Admin::Stub::GetStatus, admin::GetStatusRequest(), &s).ok());
}

TEST_F(ApiAuthTest, SetExpertMapNeedsAnAdminKey) {
  cluster::ExpertMap current;
  ASSERT_TRUE(
      AdminCall(kAlice, &admin::Admin::Stub::GetExpertMap, admin::GetExpertMapRequest(), &current)
          .ok());
  cluster::ExpertMap next = current;
  next.set_version(current.version() + 1);
  auto set = [&](const std::string& key) {
    cluster::ExpertMap out;
    return AdminCall(key, &admin::Admin::Stub::SetExpertMap, next, &out);
  };
  EXPECT_EQ(set("").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(set("unknown").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  grpc::Status client = set(kAlice);
  EXPECT_EQ(client.error_code(), grpc::StatusCode::PERMISSION_DENIED) << client.error_message();
  grpc::Status admin = set(kAdmin);
  EXPECT_TRUE(admin.ok()) << admin.error_message();
  // MeasureEngine pauses serving: an admin call too.
  cluster::EngineMeasurement m;
  EXPECT_EQ(AdminCall(kBob, &admin::Admin::Stub::MeasureEngine, cluster::MeasureEngineRequest(), &m)
                .error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
}

TEST_F(ApiAuthTest, RebalanceAndDrainNeedAnAdminKeyExpertLoadAnyKey) {
  auto call = [&](const std::string& key, const char* what) {
    grpc::ClientContext ctx;
    Key(ctx, key);
    if (std::string(what) == "rebalance") {
      admin::RebalanceRequest r;
      r.set_dry_run(true);
      admin::RebalanceResult out;
      return Admin()->Rebalance(&ctx, r, &out);
    }
    if (std::string(what) == "load") {
      admin::ExpertLoadReport out;
      return Admin()->GetExpertLoad(&ctx, admin::ExpertLoadRequest(), &out);
    }
    admin::DrainRequest d;
    d.set_worker_id("nobody");
    admin::DrainResult out;
    return std::string(what) == "drain" ? Admin()->Drain(&ctx, d, &out)
                                        : Admin()->Undrain(&ctx, d, &out);
  };
  for (const char* what : {"rebalance", "drain", "undrain"}) {
    EXPECT_EQ(call("", what).error_code(), grpc::StatusCode::UNAUTHENTICATED) << what;
    EXPECT_EQ(call(kAlice, what).error_code(), grpc::StatusCode::PERMISSION_DENIED) << what;
  }
  EXPECT_TRUE(call(kAdmin, "rebalance").ok());
  EXPECT_EQ(call(kAdmin, "drain").error_code(), grpc::StatusCode::NOT_FOUND);  // no such worker
  EXPECT_EQ(call("", "load").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(call(kAlice, "load").ok());
}

// A long Generate of `owner`, streamed on its own thread until cancelled.
class LongRequest {
 public:
  explicit LongRequest(client::Client& owner) {
    thread_ = std::thread([this, &owner] {
      v1::GenerateRequest r;
      for (int t : {1, 2, 3}) r.mutable_prompt_ids()->add_ids(t);
      r.mutable_sampling()->set_max_tokens(4000);  // within the 4096-token context
      r.mutable_sampling()->set_ignore_eos(true);
      result_ = owner.GenerateStream(r, [this](const v1::GenerateResponse& resp) {
        std::lock_guard<std::mutex> lock(mu_);
        if (id_.empty()) id_ = resp.request_id();
      });
    });
  }
  // The id its first message reported (waits for it).
  std::string id() {
    for (;;) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (!id_.empty()) return id_;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  // Waits for the stream's end.
  absl::Status Join() {
    thread_.join();
    return result_;
  }

 private:
  std::mutex mu_;
  std::string id_;
  absl::Status result_;
  std::thread thread_;
};

TEST_F(ApiAuthTest, CancelActsOnlyOnTheCallersOwnRequests) {
  auto alice = Sdk(kAlice);
  auto bob = Sdk(kBob);
  auto admin = Sdk(kAdmin);
  for (client::Client* canceller : {alice.get(), admin.get()}) {
    LongRequest request(*alice);
    const std::string id = request.id();
    ASSERT_EQ(id.size(), 32u) << id;
    // Another client key: as if the id did not exist.
    absl::StatusOr<bool> other = bob->Cancel(id);
    ASSERT_TRUE(other.ok()) << other.status();
    EXPECT_FALSE(*other);
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", std::string("Bearer ") + kBob);
    v1::CancelRequest req;
    req.set_request_id(id);
    v1::CancelResponse resp;
    grpc::Status raw =
        testing_util::PlainStub<v1::Flotilla>(cluster_->address())->Cancel(&ctx, req, &resp);
    EXPECT_EQ(raw.error_code(), grpc::StatusCode::NOT_FOUND);
    // The owner (or an admin key) cancels it.
    absl::StatusOr<bool> own = canceller->Cancel(id);
    ASSERT_TRUE(own.ok()) << own.status();
    EXPECT_TRUE(*own);
    absl::Status result = request.Join();
    EXPECT_EQ(result.code(), absl::StatusCode::kCancelled) << result;
  }
}

TEST_F(ApiAuthTest, RequestIdsAreRandom) {
  auto c = Sdk(kAlice);
  absl::StatusOr<client::GenerateResult> a = c->Generate(Prompt(1));
  absl::StatusOr<client::GenerateResult> b = c->Generate(Prompt(1));
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(a->request_id.size(), 32u) << a->request_id;
  ASSERT_EQ(b->request_id.size(), 32u) << b->request_id;
  int differing = 0;
  for (size_t i = 0; i < 32; ++i) {
    differing += std::bitset<4>(std::stoi(a->request_id.substr(i, 1), nullptr, 16) ^
                                std::stoi(b->request_id.substr(i, 1), nullptr, 16))
                     .count();
  }
  EXPECT_GE(differing, 20) << a->request_id << " " << b->request_id;  // ~64 of 128 expected
}

TEST_F(ApiAuthTest, HttpNeedsABearerKey) {
  httplib::Client http("http://" + cluster_->http_address());
  for (const std::string key : {"", "wrong"}) {
    httplib::Headers headers;
    if (!key.empty()) headers.emplace("Authorization", "Bearer " + key);
    for (const char* path : {"/v1/models", "/metrics"}) {
      auto res = http.Get(path, headers);
      ASSERT_TRUE(res) << path;
      EXPECT_EQ(res->status, 401) << path;
      nlohmann::json body = nlohmann::json::parse(res->body);
      EXPECT_EQ(body["error"]["code"], "invalid_api_key") << res->body;
      EXPECT_EQ(body["error"]["type"], "invalid_request_error") << res->body;
      EXPECT_TRUE(body["error"]["message"].is_string()) << res->body;
    }
    auto post = http.Post("/v1/chat/completions", headers,
                          R"({"messages":[{"role":"user","content":"Hi"}],"max_tokens":2})",
                          "application/json");
    ASSERT_TRUE(post);
    EXPECT_EQ(post->status, 401);
  }
  httplib::Headers alice = KeyHeaders(kAlice);
  Body(http, "/v1/models", alice, 200);
  const std::string model = Model();
  const nlohmann::json request = {
      {"model", model}, {"messages", {{{"role", "user"}, {"content", "Hi"}}}}, {"max_tokens", 2}};
  auto chat = http.Post("/v1/chat/completions", alice, request.dump(), "application/json");
  ASSERT_TRUE(chat);
  EXPECT_EQ(chat->status, 200) << chat->body;
  const std::string id = nlohmann::json::parse(chat->body)["id"];
  EXPECT_EQ(id.rfind("chatcmpl-", 0), 0u) << id;
  EXPECT_EQ(id.size(), std::string("chatcmpl-").size() + 32) << id;
  // /metrics tells about every tenant's requests: the admin key's only.
  const std::string refused = Body(http, "/metrics", alice, 403);
  EXPECT_EQ(nlohmann::json::parse(refused)["error"]["code"], "admin_key_required") << refused;
  EXPECT_NE(Body(http, "/metrics", AdminHeaders(), 200).find("flotilla_"), std::string::npos);
  // Probes go without a key.
  Body(http, "/health", {}, 200);
}

// A stored response belongs to the key that created it: another key gets the
// same 404 as for an id that never existed, on retrieve, delete and
// previous_response_id alike; its owner reads, continues and deletes it.
TEST_F(ApiAuthTest, StoredResponsesAreTheirKeysOnly) {
  httplib::Client http("http://" + cluster_->http_address());
  const httplib::Headers alice = KeyHeaders(kAlice);
  const httplib::Headers bob = KeyHeaders(kBob);
  const std::string model = Model();
  nlohmann::json request = {{"model", model}, {"input", "Remember the word kumquat."},
                            {"max_output_tokens", 4}, {"temperature", 0}};
  auto created = http.Post("/v1/responses", alice, request.dump(), "application/json");
  ASSERT_TRUE(created);
  ASSERT_EQ(created->status, 200) << created->body;
  const std::string id = nlohmann::json::parse(created->body)["id"];

  auto mine = http.Get("/v1/responses/" + id, alice);
  ASSERT_TRUE(mine);
  EXPECT_EQ(mine->status, 200) << mine->body;
  EXPECT_EQ(nlohmann::json::parse(mine->body)["id"], id);
  auto theirs = http.Get("/v1/responses/" + id, bob);
  auto never = http.Get("/v1/responses/resp_0123456789abcdef", bob);
  ASSERT_TRUE(theirs && never);
  EXPECT_EQ(theirs->status, 404);
  EXPECT_EQ(never->status, 404);
  // Nothing tells another key's id from one that never existed.
  nlohmann::json their_error = nlohmann::json::parse(theirs->body)["error"];
  nlohmann::json never_error = nlohmann::json::parse(never->body)["error"];
  std::string their_message = their_error["message"];
  their_message.replace(their_message.find(id), id.size(), "resp_0123456789abcdef");
  EXPECT_EQ(their_message, never_error["message"]);
  EXPECT_EQ(their_error["code"], never_error["code"]);

  nlohmann::json follow = {{"model", model}, {"input", "What was the word?"},
                           {"previous_response_id", id}, {"max_output_tokens", 2}};
  auto stolen = http.Post("/v1/responses", bob, follow.dump(), "application/json");
  ASSERT_TRUE(stolen);
  EXPECT_EQ(stolen->status, 404) << stolen->body;
  EXPECT_EQ(nlohmann::json::parse(stolen->body)["error"]["code"], "previous_response_not_found");
  auto continued = http.Post("/v1/responses", alice, follow.dump(), "application/json");
  ASSERT_TRUE(continued);
  EXPECT_EQ(continued->status, 200) << continued->body;

  auto deleted_by_bob = http.Delete("/v1/responses/" + id, bob);
  ASSERT_TRUE(deleted_by_bob);
  EXPECT_EQ(deleted_by_bob->status, 404);
  auto deleted = http.Delete("/v1/responses/" + id, alice);
  ASSERT_TRUE(deleted);
  EXPECT_EQ(deleted->status, 200) << deleted->body;
  EXPECT_EQ(nlohmann::json::parse(deleted->body)["deleted"], true);
  Body(http, "/v1/responses/" + id, alice, 404);
}

// A background response is its key's too while it runs: another key can
// neither read nor cancel nor delete it (404 as for an id that never
// existed); its owner cancels it.
TEST_F(ApiAuthTest, BackgroundResponsesAreTheirKeysOnly) {
  httplib::Client http("http://" + cluster_->http_address());
  const httplib::Headers alice = KeyHeaders(kAlice), bob = KeyHeaders(kBob);
  // Long enough to be running while the test acts on it.
  nlohmann::json request = {{"model", Model()},
                            {"input", "Write a long story."},
                            {"max_output_tokens", 2000},
                            {"background", true}};
  auto created = http.Post("/v1/responses", alice, request.dump(), "application/json");
  ASSERT_TRUE(created);
  ASSERT_EQ(created->status, 200) << created->body;
  const nlohmann::json started = nlohmann::json::parse(created->body);
  EXPECT_EQ(started["status"], "in_progress");
  const std::string id = started["id"];
  const std::string path = "/v1/responses/" + id;

  auto theirs = http.Get(path, bob);
  auto cancelled_by_bob = http.Post(path + "/cancel", bob, "", "application/json");
  auto deleted_by_bob = http.Delete(path, bob);
  ASSERT_TRUE(theirs && cancelled_by_bob && deleted_by_bob);
  EXPECT_EQ(theirs->status, 404) << theirs->body;
  EXPECT_EQ(cancelled_by_bob->status, 404) << cancelled_by_bob->body;
  EXPECT_EQ(deleted_by_bob->status, 404) << deleted_by_bob->body;
  EXPECT_EQ(nlohmann::json::parse(cancelled_by_bob->body)["error"]["param"], "response_id");

  auto mine = http.Get(path, alice);
  ASSERT_TRUE(mine);
  EXPECT_EQ(nlohmann::json::parse(mine->body)["status"], "in_progress") << mine->body;
  auto cancelled = http.Post(path + "/cancel", alice, "", "application/json");
  ASSERT_TRUE(cancelled);
  ASSERT_EQ(cancelled->status, 200) << cancelled->body;
  EXPECT_EQ(nlohmann::json::parse(cancelled->body)["status"], "cancelled");
  auto after = http.Get(path, alice);
  ASSERT_TRUE(after);
  EXPECT_EQ(nlohmann::json::parse(after->body)["status"], "cancelled") << after->body;
}

// The prefix cache's counters as the admin sees them: {queries, hits} in tokens.
std::pair<uint64_t, uint64_t> PrefixCounters(httplib::Client& http) {
  auto res = http.Get("/metrics", AdminHeaders());
  if (!res || res->status != 200) return {0, 0};
  auto value = [&](const std::string& name) -> uint64_t {  // name{labels} value
    const size_t at = res->body.find("\n" + name + "{");
    if (at == std::string::npos) return 0;
    return std::stoull(res->body.substr(res->body.find("} ", at) + 2));
  };
  return {value("flotilla_prefix_cache_queries_tokens_total"),
          value("flotilla_prefix_cache_hits_tokens_total")};
}

// Sends `prompt` (token ids) as `headers`' key with `salt` (empty: none) and
// returns how many of its tokens the worker found in its prefix cache, once
// its lookup shows in the counters (workers report them with their load).
int64_t CachedTokensOf(httplib::Client& http, const httplib::Headers& headers,
                       const std::vector<int>& prompt, const std::string& salt,
                       const std::string& model) {
  // A new last token each time: the blocks before it are what may be cached
  // (the tiny model's sliding layers keep only the window before a prompt's end).
  static int tail = 60000;
  std::vector<int> ids = prompt;
  ids.push_back(++tail);
  // Earlier requests' lookups reach the counters with the workers' load
  // reports: once the cluster is idle, the counters cover them all.
  if (!ApiAuthTest::WaitIdle()) {
    ADD_FAILURE() << "the cluster never went idle";
    return -1;
  }
  const auto [queries, hits] = PrefixCounters(http);
  nlohmann::json request = {{"model", model}, {"prompt", ids}, {"max_tokens", 1}};
  if (!salt.empty()) request["cache_salt"] = salt;
  auto res = http.Post("/v1/completions", headers, request.dump(), "application/json");
  EXPECT_TRUE(res && res->status == 200) << (res ? res->body : "no answer");
  for (int i = 0; i < 600; ++i) {
    const auto [q, h] = PrefixCounters(http);
    if (q >= queries + ids.size()) return static_cast<int64_t>(h - hits);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ADD_FAILURE() << "the prefix lookup never showed in /metrics";
  return -1;
}

// Cached prompt blocks are shared within a key, or among requests of one
// cache_salt, never across keys: another tenant's prompt is never a hit
// (so its time to first token tells nothing).
TEST_F(ApiAuthTest, PrefixCacheIsSharedOnlyWithinAKeyOrASalt) {
  httplib::Client http("http://" + cluster_->http_address());
  const httplib::Headers alice = KeyHeaders(kAlice);
  const httplib::Headers bob = KeyHeaders(kBob);
  const std::string model = Model();
  std::vector<int> prompt;
  for (int i = 0; i < 160; ++i) prompt.push_back(1000 + (i * 7919) % 50000);
  EXPECT_EQ(CachedTokensOf(http, alice, prompt, "", model), 0);
  EXPECT_EQ(CachedTokensOf(http, bob, prompt, "", model), 0);      // alice's blocks: not bob's
  EXPECT_GT(CachedTokensOf(http, alice, prompt, "", model), 100);  // alice's own
  EXPECT_GT(CachedTokensOf(http, bob, prompt, "", model), 100);    // bob's own, from his miss

  prompt[0] += 1;  // a prompt nobody sent
  EXPECT_EQ(CachedTokensOf(http, bob, prompt, "team-a", model), 0);
  EXPECT_GT(CachedTokensOf(http, alice, prompt, "team-a", model), 100);  // one salt: one domain
  EXPECT_EQ(CachedTokensOf(http, alice, prompt, "", model), 0);          // not alice's own domain
  EXPECT_EQ(CachedTokensOf(http, bob, prompt, "team-b", model), 0);

  nlohmann::json bad = {{"model", model}, {"prompt", "x"}, {"cache_salt", ""}};
  auto refused = http.Post("/v1/completions", alice, bad.dump(), "application/json");
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 400);
  EXPECT_EQ(nlohmann::json::parse(refused->body)["error"]["param"], "cache_salt");
}

TEST_F(ApiAuthTest, MetricsListenerIsOpenAndServesOnlyMetrics) {
  ASSERT_GT(metrics_port_, 0);
  httplib::Client metrics("127.0.0.1", metrics_port_);
  EXPECT_NE(Body(metrics, "/metrics", {}, 200).find("flotilla_requests_in_flight"),
            std::string::npos);
  Body(metrics, "/v1/models", {}, 404);
}

TEST_F(ApiAuthTest, CliSendsTheKey) {
  const std::string generate = std::string(FLOTILLA_BIN_DIR) + "/flotilla generate --coordinator " +
                               cluster_->address() + " --prompt-ids 1,2,3 --max-tokens 2 --json";
  auto [rc, out] = RunWithStderr(generate);
  EXPECT_NE(rc, 0) << out;
  EXPECT_NE(out.find("API key"), std::string::npos) << out;
  std::tie(rc, out) = RunWithStderr(generate + " --api-key " + kAlice);
  EXPECT_EQ(rc, 0) << out;
  std::tie(rc, out) = RunWithStderr(std::string("FLOTILLA_API_KEY=") + kBob + " " +
                                    FLOTILLA_BIN_DIR + "/flotilla chat --coordinator " +
                                    cluster_->address() + " --prompt Hi --max-tokens 2");
  EXPECT_EQ(rc, 0) << out;
}

}  // namespace
}  // namespace flotilla
