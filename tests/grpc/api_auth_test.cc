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
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "proto/admin.grpc.pb.h"
#include "tools/cli/local_cluster.h"
#include "tools/sdk/client.h"

#include "tests/run_command.h"

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

std::pair<int, std::string> RunCommand(const std::string& cmd) {
  return flotilla::testing_util::RunCommandWithStderr(cmd);
}

class ApiAuthTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    setenv("FLOTILLA_BIN_DIR", FLOTILLA_BIN_DIR, 1);
    unsetenv("FLOTILLA_API_KEY");
    const std::string dir = TempDir();
    std::ofstream(dir + "/api-keys") << "# clients\n" << kAlice << "\n\n" << kBob << "\n";
    std::ofstream(dir + "/admin-keys") << kAdmin << "\n";
    cli::LocalClusterOptions o;
    o.workers = 1;
    o.threads_per_worker = 1;
    o.api_key_file = dir + "/api-keys";
    o.admin_key_file = dir + "/admin-keys";
    o.coordinator_args = {"--metrics-listen", "127.0.0.1:0", "--metrics-port-file",
                          dir + "/metrics-port"};
    auto c = cli::LocalCluster::Start(o);
    ASSERT_TRUE(c.ok()) << c.status();
    cluster_ = c->release();
    std::ifstream(dir + "/metrics-port") >> metrics_port_;
  }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
  }
  void SetUp() override { ASSERT_NE(cluster_, nullptr); }

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
    return admin::Admin::NewStub(
        grpc::CreateChannel(cluster_->address(), grpc::InsecureChannelCredentials()));
  }
  static void Key(grpc::ClientContext& ctx, const std::string& key) {
    if (!key.empty()) ctx.AddMetadata("authorization", "Bearer " + key);
  }
  static v1::GenerateRequest Prompt(uint32_t max_tokens) {
    v1::GenerateRequest r;
    for (int id : {1, 2, 3}) r.mutable_prompt_ids()->add_ids(id);
    r.mutable_sampling()->set_max_tokens(max_tokens);
    r.mutable_sampling()->set_ignore_eos(true);
    return r;
  }
  static cli::LocalCluster* cluster_;
  static int metrics_port_;
};
cli::LocalCluster* ApiAuthTest::cluster_ = nullptr;
int ApiAuthTest::metrics_port_ = 0;

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
    grpc::ClientContext ctx;
    Key(ctx, key);
    admin::ClusterStatus s;
    EXPECT_EQ(Admin()->GetStatus(&ctx, admin::GetStatusRequest(), &s).error_code(),
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
    grpc::ClientContext ctx;
    Key(ctx, key);
    admin::ClusterStatus s;
    EXPECT_TRUE(Admin()->GetStatus(&ctx, admin::GetStatusRequest(), &s).ok()) << "reads: any key";
  }
}

TEST_F(ApiAuthTest, GrpcHealthStaysOpen) {
  grpc::GenericStub stub(
      grpc::CreateChannel(cluster_->address(), grpc::InsecureChannelCredentials()));
  grpc::CompletionQueue cq;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::Slice empty("");
  grpc::ByteBuffer request(&empty, 1);  // HealthCheckRequest{service: ""}
  auto call = stub.PrepareUnaryCall(&ctx, "/grpc.health.v1.Health/Check", request, &cq);
  call->StartCall();
  grpc::ByteBuffer response;
  grpc::Status status;
  call->Finish(&response, &status, reinterpret_cast<void*>(1));
  void* tag = nullptr;
  bool ok = false;
  ASSERT_TRUE(cq.Next(&tag, &ok));
  EXPECT_TRUE(status.ok()) << status.error_message();
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(response.Dump(&slices).ok());
  std::string bytes;
  for (const grpc::Slice& s : slices)
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  EXPECT_EQ(bytes, std::string("\x08\x01", 2)) << "SERVING";
}

TEST_F(ApiAuthTest, SetExpertMapNeedsAnAdminKey) {
  cluster::ExpertMap current;
  {
    grpc::ClientContext ctx;
    Key(ctx, kAlice);
    ASSERT_TRUE(Admin()->GetExpertMap(&ctx, admin::GetExpertMapRequest(), &current).ok());
  }
  cluster::ExpertMap next = current;
  next.set_version(current.version() + 1);
  auto set = [&](const std::string& key) {
    grpc::ClientContext ctx;
    Key(ctx, key);
    cluster::ExpertMap out;
    return Admin()->SetExpertMap(&ctx, next, &out);
  };
  EXPECT_EQ(set("").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(set("unknown").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  grpc::Status client = set(kAlice);
  EXPECT_EQ(client.error_code(), grpc::StatusCode::PERMISSION_DENIED) << client.error_message();
  grpc::Status admin = set(kAdmin);
  EXPECT_TRUE(admin.ok()) << admin.error_message();
  // MeasureEngine pauses serving: an admin call too.
  grpc::ClientContext ctx;
  Key(ctx, kBob);
  cluster::EngineMeasurement m;
  EXPECT_EQ(Admin()->MeasureEngine(&ctx, cluster::MeasureEngineRequest(), &m).error_code(),
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
        v1::Flotilla::NewStub(
            grpc::CreateChannel(cluster_->address(), grpc::InsecureChannelCredentials()))
            ->Cancel(&ctx, req, &resp);
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
  httplib::Headers alice = {{"Authorization", std::string("Bearer ") + kAlice}};
  auto models = http.Get("/v1/models", alice);
  ASSERT_TRUE(models);
  EXPECT_EQ(models->status, 200);
  const std::string model = cluster_->model().substr(cluster_->model().find_last_of('/') + 1);
  const nlohmann::json request = {
      {"model", model}, {"messages", {{{"role", "user"}, {"content", "Hi"}}}}, {"max_tokens", 2}};
  auto chat = http.Post("/v1/chat/completions", alice, request.dump(), "application/json");
  ASSERT_TRUE(chat);
  EXPECT_EQ(chat->status, 200) << chat->body;
  const std::string id = nlohmann::json::parse(chat->body)["id"];
  EXPECT_EQ(id.rfind("chatcmpl-", 0), 0u) << id;
  EXPECT_EQ(id.size(), std::string("chatcmpl-").size() + 32) << id;
  auto metrics = http.Get("/metrics", alice);
  ASSERT_TRUE(metrics);
  EXPECT_EQ(metrics->status, 200);
  // Probes go without a key.
  auto health = http.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
}

TEST_F(ApiAuthTest, MetricsListenerIsOpenAndServesOnlyMetrics) {
  ASSERT_GT(metrics_port_, 0);
  httplib::Client metrics("127.0.0.1", metrics_port_);
  auto res = metrics.Get("/metrics");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_NE(res->body.find("flotilla_requests_in_flight"), std::string::npos);
  auto other = metrics.Get("/v1/models");
  ASSERT_TRUE(other);
  EXPECT_EQ(other->status, 404);
}

TEST_F(ApiAuthTest, CliSendsTheKey) {
  const std::string generate = std::string(FLOTILLA_BIN_DIR) + "/flotilla generate --coordinator " +
                               cluster_->address() + " --prompt-ids 1,2,3 --max-tokens 2 --json";
  auto [rc, out] = RunCommand(generate);
  EXPECT_NE(rc, 0) << out;
  EXPECT_NE(out.find("API key"), std::string::npos) << out;
  std::tie(rc, out) = RunCommand(generate + " --api-key " + kAlice);
  EXPECT_EQ(rc, 0) << out;
  std::tie(rc, out) = RunCommand(std::string("FLOTILLA_API_KEY=") + kBob + " " + FLOTILLA_BIN_DIR +
                                 "/flotilla chat --coordinator " + cluster_->address() +
                                 " --prompt Hi --max-tokens 2");
  EXPECT_EQ(rc, 0) << out;
}

}  // namespace
}  // namespace flotilla
