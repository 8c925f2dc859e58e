// The /v1/responses HTTP driver's background lifecycle without a cluster or
// sockets: a scripted backend delivers the workers' updates and failures in a
// chosen order, a recording exchange stands for the connection. Background
// responses answer at once and are stored running, then as they end
// (completed, failed with the error); cancel stops their sequences and ends
// their stream; a client leaving does not cancel them; delete stops them.
#include "coordinator/http/responses_http.h"

#include <gtest/gtest.h>

#include <map>

#include "common/harmony/message.h"
#include "tests/coordinator/fake_backend.h"
#include "tests/harmony_completion.h"

namespace flotilla::coordinator {
namespace {

namespace tk = tokenizer;
using Json = nlohmann::ordered_json;
using test_support::Completion;
using test_support::Tok;

// The cluster: takes sequences and plays their updates when the test says.
class ScriptedBackend : public test_support::FakeBackend {
 public:
  // Sequence `id` generates the tokens of `messages` and finishes.
  void Finish(uint64_t id, const std::vector<harmony::Message>& messages) {
    tk::TokenId stop;
    const std::vector<tk::TokenId> tokens = Completion(messages, &stop);
    Update(id, tokens, common::STOP, stop, static_cast<uint32_t>(tokens.size() + 1));
    Done(id);
  }
  void Fail(uint64_t id, absl::Status status) { Done(id, std::move(status)); }
};

// The connection: records what the driver sends.
class RecordingExchange : public HttpExchange {
 public:
  explicit RecordingExchange(const Json& body) {
    request_.method = "POST";
    request_.target = request_.path = "/v1/responses";
    request_.body = body.dump();
    request_.received = absl::Now();
  }
  const HttpRequest& request() const override { return request_; }
  void Send(HttpResponse response) override { sent.push_back(std::move(response)); }
  void BeginStream(HttpResponse head) override { stream_began = true; }
  void Write(std::string data) override { streamed += data; }
  void End() override { stream_ended = true; }
  void OnClientGone(std::function<void()> f) override { client_gone = std::move(f); }
  void After(absl::Duration, std::function<void()>) override {}
  void Defer(std::function<void()> f) override { f(); }
  void Hold(std::shared_ptr<void>) override {}

  std::vector<HttpResponse> sent;
  bool stream_began = false, stream_ended = false;
  std::string streamed;
  std::function<void()> client_gone;

 private:
  HttpRequest request_;
};

harmony::Message Final(const std::string& text) {
  harmony::Message m;
  m.role = harmony::Role::kAssistant;
  m.channel = "final";
  m.content = text;
  return m;
}

class ResponsesHttpTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto store = ResponseStore::Create({});
    ASSERT_TRUE(store.ok());
    store_ = *std::move(store);
    context_.backend = &backend_;
    context_.tokenizer = &Tok();
    context_.store = store_.get();
    context_.model_id = "m";
    context_.served_model_names = {"m"};
    context_.in_flight = &in_flight_;
  }

  // POSTs `extra` merged into a small request as `owner`; the exchange.
  std::shared_ptr<RecordingExchange> Post(const Json& extra, const std::string& owner = "alice") {
    Json body = {{"model", "m"}, {"input", "Hi"}, {"max_output_tokens", 64}};
    for (const auto& [key, value] : extra.items()) body[key] = value;
    auto exchange = std::make_shared<RecordingExchange>(body);
    ServeResponses(context_, exchange, owner, std::nullopt, SessionHooks{});
    return exchange;
  }
  Json Stored(const std::string& id, const std::string& owner = "alice") {
    HttpResponse res = RetrieveResponse(context_, id, owner, "/v1/responses/" + id);
    EXPECT_EQ(res.status, 200) << res.body;
    return Json::parse(res.body);
  }
  static Json Body(const HttpResponse& res) { return Json::parse(res.body); }

  ScriptedBackend backend_;
  std::unique_ptr<ResponseStore> store_;
  std::atomic<int64_t> in_flight_{0};
  ResponsesHttpContext context_;
};

TEST_F(ResponsesHttpTest, BackgroundAnswersAtOnceAndIsStoredUntilItEnds) {
  auto exchange = Post({{"background", true}});
  ASSERT_EQ(exchange->sent.size(), 1u);  // before any token
  const Json started = Body(exchange->sent[0]);
  EXPECT_EQ(exchange->sent[0].status, 200) << started.dump();
  EXPECT_EQ(started["status"], "in_progress");
  EXPECT_EQ(started["background"], true);
  const std::string id = started["id"];
  EXPECT_EQ(Stored(id)["status"], "in_progress");
  // Another key sees nothing, as for any stored response.
  EXPECT_EQ(RetrieveResponse(context_, id, "bob", "/v1/responses/" + id).status, 404);
  EXPECT_EQ(CancelResponse(context_, id, "bob").status, 404);
  // A running response cannot be continued yet.
  auto follow = Post({{"previous_response_id", id}});
  ASSERT_EQ(follow->sent.size(), 1u);
  EXPECT_EQ(follow->sent[0].status, 400);
  EXPECT_EQ(Body(follow->sent[0])["error"]["param"], "previous_response_id");

  backend_.Finish(1, {Final("Hello.")});
  EXPECT_EQ(exchange->sent.size(), 1u);  // nothing more to the request
  const Json done = Stored(id);
  EXPECT_EQ(done["status"], "completed");
  ASSERT_EQ(done["output"].size(), 1u) << done.dump();
  EXPECT_EQ(done["output"][0]["content"][0]["text"], "Hello.");
  EXPECT_FALSE(done["usage"].is_null());
  // Too late to cancel.
  HttpResponse cancel = CancelResponse(context_, id, "alice");
  EXPECT_EQ(cancel.status, 400);
  EXPECT_NE(Body(cancel)["error"]["message"].get<std::string>().find("completed"),
            std::string::npos);
}

TEST_F(ResponsesHttpTest, AFailedBackgroundResponseSaysWhy) {
  auto exchange = Post({{"background", true}});
  const std::string id = Body(exchange->sent.at(0))["id"];
  backend_.Fail(1, absl::UnavailableError("worker worker-0 was lost"));
  EXPECT_EQ(exchange->sent.size(), 1u);
  const Json failed = Stored(id);
  EXPECT_EQ(failed["status"], "failed");
  EXPECT_NE(failed["error"]["message"].get<std::string>().find("worker-0 was lost"),
            std::string::npos)
      << failed.dump();
  EXPECT_TRUE(failed["usage"].is_null());
}

TEST_F(ResponsesHttpTest, CancelStopsTheSequenceAndTheClientLeavingDoesNot) {
  auto exchange = Post({{"background", true}});
  const std::string id = Body(exchange->sent.at(0))["id"];
  // The request's connection closing leaves a background response running.
  if (exchange->client_gone) exchange->client_gone();
  EXPECT_TRUE(backend_.sequences.at(1).cancelled.empty());

  HttpResponse cancel = CancelResponse(context_, id, "alice");
  ASSERT_EQ(cancel.status, 200) << cancel.body;
  EXPECT_EQ(Body(cancel)["status"], "cancelled");
  EXPECT_FALSE(backend_.sequences.at(1).cancelled.empty());
  EXPECT_EQ(Stored(id)["status"], "cancelled");
  HttpResponse again = CancelResponse(context_, id, "alice");
  EXPECT_EQ(again.status, 200);
  EXPECT_EQ(Body(again)["status"], "cancelled");

  // Delete stops a running one too, so its end does not store it again.
  auto other = Post({{"background", true}});
  const std::string other_id = Body(other->sent.at(0))["id"];
  EXPECT_EQ(DeleteResponse(context_, other_id, "alice").status, 200);
  EXPECT_FALSE(backend_.sequences.at(2).cancelled.empty());
  EXPECT_EQ(RetrieveResponse(context_, other_id, "alice", "/").status, 404);
}

TEST_F(ResponsesHttpTest, ACancelledBackgroundStreamEnds) {
  auto exchange = Post({{"background", true}, {"stream", true}});
  EXPECT_TRUE(exchange->sent.empty());
  EXPECT_TRUE(exchange->stream_began);
  EXPECT_NE(exchange->streamed.find("event: response.created"), std::string::npos);
  const size_t at = exchange->streamed.find("\"id\":\"resp_");
  ASSERT_NE(at, std::string::npos);
  const std::string id =
      exchange->streamed.substr(at + 6, exchange->streamed.find('"', at + 6) - at - 6);
  EXPECT_EQ(Stored(id)["background"], true);
  ASSERT_EQ(CancelResponse(context_, id, "alice").status, 200);
  EXPECT_TRUE(exchange->stream_ended);
  EXPECT_NE(exchange->streamed.find("response_cancelled"), std::string::npos) << exchange->streamed;
  EXPECT_FALSE(backend_.sequences.at(1).cancelled.empty());
}

TEST_F(ResponsesHttpTest, OnlyBackgroundResponsesCanBeCancelled) {
  auto exchange = Post({});
  backend_.Finish(1, {Final("Hi.")});
  ASSERT_EQ(exchange->sent.size(), 1u);
  const std::string id = Body(exchange->sent[0])["id"];
  HttpResponse cancel = CancelResponse(context_, id, "alice");
  EXPECT_EQ(cancel.status, 400);
  EXPECT_EQ(Body(cancel)["error"]["param"], "response_id");
  HttpResponse resumed =
      RetrieveResponse(context_, id, "alice", "/v1/responses/" + id + "?stream=true");
  EXPECT_EQ(resumed.status, 400);
  EXPECT_EQ(Body(resumed)["error"]["param"], "stream");
}

}  // namespace
}  // namespace flotilla::coordinator
