// CORS (--allowed-origins), /ping and /version: the policy alone, then on a
// local cluster with API keys on, as a browser and a load balancer call it.
#include "coordinator/http/cors.h"

#include <gtest/gtest.h>
#include <httplib.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "common/build_info.h"
#include "nlohmann/json.hpp"
#include "tests/local_cluster_suite.h"
#include "tests/run_command.h"

namespace flotilla {
namespace {

using coordinator::CorsPolicy;
using coordinator::HttpRequest;
using coordinator::HttpResponse;

constexpr char kOrigin[] = "https://app.example.com";
constexpr char kKey[] = "sk-cors-test-key";

HttpRequest Preflight(const std::string& origin) {
  HttpRequest r;
  r.method = "OPTIONS";
  r.path = "/v1/chat/completions";
  r.headers = {{"Origin", origin},
               {"Access-Control-Request-Method", "POST"},
               {"Access-Control-Request-Headers", "authorization, content-type"}};
  return r;
}

std::string Header(const HttpResponse& res, const std::string& name) {
  for (const auto& [k, v] : res.headers) {
    if (k == name) return v;
  }
  return "";
}

TEST(CorsPolicy, OffByDefault) {
  CorsPolicy off;
  HttpResponse res;
  EXPECT_FALSE(off.enabled());
  EXPECT_FALSE(off.AnswerPreflight(Preflight(kOrigin), res));
  off.Decorate(Preflight(kOrigin), res);
  EXPECT_TRUE(res.headers.empty());
}

TEST(CorsPolicy, ListedOriginsOnly) {
  absl::StatusOr<CorsPolicy> policy = CorsPolicy::Create({kOrigin, "http://localhost:3000"});
  ASSERT_TRUE(policy.ok()) << policy.status();
  HttpResponse res;
  ASSERT_TRUE(policy->AnswerPreflight(Preflight("HTTPS://APP.example.com"), res));
  EXPECT_EQ(res.status, 204);
  EXPECT_EQ(Header(res, "Access-Control-Allow-Origin"), "HTTPS://APP.example.com");
  EXPECT_EQ(Header(res, "Access-Control-Allow-Headers"), "authorization, content-type");
  EXPECT_EQ(Header(res, "Vary"), "Origin");
  HttpResponse other;
  EXPECT_FALSE(policy->AnswerPreflight(Preflight("https://evil.example.com"), other));
  policy->Decorate(Preflight("https://evil.example.com"), other);
  EXPECT_TRUE(other.headers.empty());
  HttpRequest get;
  get.method = "GET";
  EXPECT_FALSE(policy->AnswerPreflight(get, other)) << "no Origin, no preflight";
}

TEST(CorsPolicy, StarAllowsEveryOrigin) {
  absl::StatusOr<CorsPolicy> policy = CorsPolicy::Create({"*"});
  ASSERT_TRUE(policy.ok());
  HttpResponse res;
  policy->Decorate(Preflight("https://anything.example"), res);
  EXPECT_EQ(Header(res, "Access-Control-Allow-Origin"), "*");
}

TEST(CorsPolicy, MalformedOriginsAreRefusedByName) {
  for (const std::string bad : {"app.example.com", "https://app.example.com/", "ftp://x", "https://a b"}) {
    absl::StatusOr<CorsPolicy> policy = CorsPolicy::Create({bad});
    ASSERT_FALSE(policy.ok()) << bad;
    EXPECT_NE(policy.status().message().find(bad), std::string::npos) << policy.status();
  }
}

class CorsClusterTest : public testing_util::LocalClusterSuite<CorsClusterTest> {
 public:
  static void Configure(cli::LocalClusterOptions& o) {
    key_file_ = ::testing::TempDir() + "/flotilla-cors-keys-" + std::to_string(getpid());
    std::ofstream(key_file_) << kKey << "\n";
    o.api_key_file = key_file_;
    o.coordinator_args = {"--allowed-origins", std::string(kOrigin) + ",http://localhost:3000"};
  }
  static void TearDownTestSuite() {
    LocalClusterSuite::TearDownTestSuite();
    std::filesystem::remove(key_file_);
  }

 protected:
  static httplib::Client Client() { return httplib::Client("http://" + cluster_->http_address()); }
  static std::string Body(bool stream) {
    return nlohmann::json{{"model", cluster_->model_id()},
                          {"max_tokens", 3},
                          {"stream", stream},
                          {"messages", {{{"role", "user"}, {"content", "hi"}}}}}
        .dump();
  }
  static inline std::string key_file_;
};

TEST_F(CorsClusterTest, PreflightIsAnsweredWithoutAKey) {
  auto c = Client();
  httplib::Request req;
  req.method = "OPTIONS";
  req.path = "/v1/chat/completions";
  req.headers = {{"Origin", kOrigin},
                 {"Access-Control-Request-Method", "POST"},
                 {"Access-Control-Request-Headers", "authorization, content-type, x-stainless-os"}};
  auto res = c.send(req);
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  EXPECT_EQ(res->status, 204) << res->body;
  EXPECT_EQ(res->get_header_value("Access-Control-Allow-Origin"), kOrigin);
  EXPECT_NE(res->get_header_value("Access-Control-Allow-Methods").find("POST"), std::string::npos);
  EXPECT_EQ(res->get_header_value("Access-Control-Allow-Headers"),
            "authorization, content-type, x-stainless-os");
  // Another origin's preflight is not answered as one.
  req.headers = {{"Origin", "https://evil.example.com"}, {"Access-Control-Request-Method", "POST"}};
  res = c.send(req);
  ASSERT_TRUE(res);
  EXPECT_NE(res->status, 204);
  EXPECT_FALSE(res->has_header("Access-Control-Allow-Origin"));
}

TEST_F(CorsClusterTest, AnswersToAnAllowedOriginCarryIt) {
  auto c = Client();
  const httplib::Headers from_app = {{"Origin", kOrigin}, {"Authorization", std::string("Bearer ") + kKey}};
  for (bool stream : {false, true}) {
    auto res = c.Post("/v1/chat/completions", from_app, Body(stream), "application/json");
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 200) << res->body;
    EXPECT_EQ(res->get_header_value("Access-Control-Allow-Origin"), kOrigin) << "stream " << stream;
  }
  // Errors too (a browser must be able to read why it was refused).
  auto refused = c.Get("/v1/models", {{"Origin", kOrigin}});
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 401);
  EXPECT_EQ(refused->get_header_value("Access-Control-Allow-Origin"), kOrigin);
  auto unlisted = c.Get("/v1/models", {{"Origin", "https://evil.example.com"},
                                       {"Authorization", std::string("Bearer ") + kKey}});
  ASSERT_TRUE(unlisted);
  EXPECT_EQ(unlisted->status, 200);
  EXPECT_FALSE(unlisted->has_header("Access-Control-Allow-Origin"));
}

TEST_F(CorsClusterTest, PingNeedsNoKeyAndVersionTellsTheBuild) {
  auto c = Client();
  auto ping = c.Get("/ping");
  ASSERT_TRUE(ping);
  EXPECT_EQ(ping->status, 200);
  auto version = c.Get("/version", {{"Authorization", std::string("Bearer ") + kKey}});
  ASSERT_TRUE(version);
  ASSERT_EQ(version->status, 200) << version->body;
  const nlohmann::json v = nlohmann::json::parse(version->body);
  EXPECT_EQ(v["version"], GetBuildInfo().version);
  EXPECT_EQ(v["cuda"], GetBuildInfo().cuda);
  auto unkeyed = c.Get("/version");
  ASSERT_TRUE(unkeyed);
  EXPECT_EQ(unkeyed->status, 401);
}

TEST(CorsFlag, MalformedOriginStopsTheCoordinatorAtStart) {
  auto [rc, out] = testing_util::RunCommandWithStderr(
      std::string(FLOTILLA_BIN_DIR) + "/flotilla-coordinator --model synthetic:tiny "
      "--allowed-origins https://app.example.com/path");
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("--allowed-origins: 'https://app.example.com/path' is not an origin"),
            std::string::npos)
      << out;
}

}  // namespace
}  // namespace flotilla
