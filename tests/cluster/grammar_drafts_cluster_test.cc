// Grammar-forced drafts end to end: two local clusters of the trained demo
// model, one worker each, with --grammar-drafts on (the default) and off.
// JSON-schema answers (greedy and seeded) and a required tool call through
// the HTTP API are the same on both, token counts included; the cluster with
// forced drafts counts drafted and accepted tokens in /metrics, the other
// none.
#include <gtest/gtest.h>

#include <chrono>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "tests/local_cluster_suite.h"

namespace flotilla {
namespace {

using Json = nlohmann::json;

std::unique_ptr<cli::LocalCluster> StartDemo(bool grammar_drafts) {
  setenv("FLOTILLA_BIN_DIR", FLOTILLA_BIN_DIR, 1);
  cli::LocalClusterOptions o;
  o.workers = 1;
  o.threads_per_worker = 1;
  o.model = "synthetic:demo";
  o.worker_args = {"--grammar-drafts", grammar_drafts ? "on" : "off"};
  absl::StatusOr<std::unique_ptr<cli::LocalCluster>> started = cli::LocalCluster::Start(o);
  EXPECT_TRUE(started.ok()) << started.status();
  return started.ok() ? *std::move(started) : nullptr;
}

// The reply's message (content or tool calls) and its token counts.
std::string Ask(const cli::LocalCluster& cluster, Json body) {
  body["model"] = cluster.model_id();
  httplib::Client client("http://" + cluster.http_address());
  client.set_read_timeout(120, 0);
  auto res = client.Post("/v1/chat/completions", body.dump(), "application/json");
  if (!res) return "no reply";
  if (res->status != 200) return "HTTP " + std::to_string(res->status) + ": " + res->body;
  const Json reply = Json::parse(res->body, nullptr, false);
  if (reply.is_discarded()) return "not JSON: " + res->body;
  const Json& message = reply["choices"][0]["message"];
  return (message.contains("content") ? message["content"].dump() : "") + " " +
         (message.contains("tool_calls") ? message["tool_calls"][0]["function"].dump() : "") +
         " tokens " + reply["usage"]["completion_tokens"].dump();
}

std::vector<Json> Requests() {
  const Json days_schema = {{"type", "object"},
                            {"properties", {{"days", {{"type", "integer"}}}}},
                            {"required", {"days"}},
                            {"additionalProperties", false}};
  const Json capital_schema = {
      {"type", "object"},
      {"properties", {{"country", {{"type", "string"}}}, {"capital", {{"type", "string"}}}}},
      {"required", {"country", "capital"}},
      {"additionalProperties", false}};
  auto json_answer = [](const std::string& question, const Json& schema) {
    return Json{{"messages", {{{"role", "user"}, {"content", question + " Answer in JSON."}}}},
                {"max_tokens", 96},
                {"temperature", 0},
                {"response_format",
                 {{"type", "json_schema"},
                  {"json_schema", {{"name", "answer"}, {"strict", true}, {"schema", schema}}}}}};
  };
  std::vector<Json> out = {json_answer("How many days are in March?", days_schema),
                           json_answer("What is the capital of France?", capital_schema)};
  Json seeded = out[1];
  seeded["temperature"] = 0.8;
  seeded["seed"] = 5;
  out.push_back(seeded);
  Json call = {{"messages", {{{"role", "user"}, {"content", "What's the weather in Paris?"}}}},
               {"max_tokens", 96},
               {"temperature", 0},
               {"tool_choice", "required"},
               {"tools",
                {{{"type", "function"},
                  {"function",
                   {{"name", "get_weather"},
                    {"description", "Get the current weather in a city"},
                    {"parameters",
                     {{"type", "object"},
                      {"properties", {{"location", {{"type", "string"}}}}},
                      {"required", {"location"}}}}}}}}}};
  out.push_back(call);
  return out;
}

TEST(GrammarDraftsCluster, StructuredAnswersAndToolCallsAreTheSameWithAndWithout) {
  std::vector<std::string> without;
  {
    std::unique_ptr<cli::LocalCluster> off = StartDemo(false);
    ASSERT_NE(off, nullptr);
    for (const Json& r : Requests()) without.push_back(Ask(*off, r));
    EXPECT_LE(testing_util::ScrapeMetric(off->http_address(),
                                         "flotilla_spec_decode_num_draft_tokens_total"),
              0);
  }
  std::unique_ptr<cli::LocalCluster> on = StartDemo(true);
  ASSERT_NE(on, nullptr);
  const std::vector<Json> requests = Requests();
  for (size_t i = 0; i < requests.size(); ++i) {
    const std::string got = Ask(*on, requests[i]);
    EXPECT_EQ(got, without[i]) << requests[i].dump();
    EXPECT_NE(got.find(" tokens "), std::string::npos) << got;
    EXPECT_EQ(got.find("HTTP "), std::string::npos) << got;
  }
  // The answers' forced text was drafted and accepted (the demo model
  // writes it in its canonical tokens). The counters are reported with the
  // worker's load; wait for the last one.
  double drafted = 0, accepted = 0;
  for (int i = 0; i < 100 && accepted <= 0; ++i) {
    drafted = testing_util::ScrapeMetric(on->http_address(),
                                         "flotilla_spec_decode_num_draft_tokens_total");
    accepted = testing_util::ScrapeMetric(on->http_address(),
                                          "flotilla_spec_decode_num_accepted_tokens_total");
    if (accepted <= 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_GT(drafted, 0);
  EXPECT_GT(accepted, 0);
  std::cout << "forced drafts: " << drafted << " drafted, " << accepted << " accepted\n";
}

}  // namespace
}  // namespace flotilla
