// Grammar-forced drafts (SchedulerLimits::grammar_drafts): a structured-output
// request whose grammar admits one continuation drafts its tokens, and the
// serving loop on a real CPU engine gives the tokens of a run without them,
// greedy and seeded, on random synthetic weights and on the trained demo
// model, where a JSON answer and a tool call take clearly fewer decode
// steps. Every KV block comes back after each run.
#include <gtest/gtest.h>

#include <iostream>
#include <map>
#include <nlohmann/json.hpp>

#include "comm/local/local_communicator.h"
#include "common/harmony/renderer.h"
#include "tests/worker/resume_harness.h"
#include "worker/engine/cpu_engine.h"
#include "worker/model/model_source.h"
#include "worker/parallel/host_context.h"

namespace flotilla::worker {
namespace {

using resume_testing::ServeOptions;
using resume_testing::TokenOf;
using resume_testing::Updates;

struct Served {
  std::map<uint64_t, std::vector<int32_t>> tokens;  // by request id
  SpeculativeCounts counts;
  int steps = 0;  // engine steps of the serving loop (one rank only)
};

// `submits` served by `world` CPU ranks (tensor-parallel) of `weights`,
// grammar drafts on or off, drafters off unless `o` sets one.
Served Serve(const std::vector<cluster::SubmitSequence>& submits, bool grammar_drafts,
             const ModelWeights* weights = nullptr, ServeOptions o = {}, int world = 1) {
  Served run;
  o.max_batch_tokens = 256;
  o.grammar_drafts = grammar_drafts;
  o.counts = &run.counts;
  if (world == 1) {
    o.step_micros = [&run](const cluster::StepPlan&) {
      ++run.steps;
      return int64_t{1000};
    };
  }
  const Updates got = resume_testing::OnLocalRanks(world, [&](int rank, comm::Communicator* comm) {
    return resume_testing::ServeCpuRank(submits, world, rank, comm, o, weights,
                                        /*kv_positions=*/512);
  });
  for (const cluster::SequenceUpdate& u : got) {
    EXPECT_NE(u.finish_reason(), common::ERROR) << u.error();
    auto& tokens = run.tokens[u.request_id()];
    tokens.insert(tokens.end(), u.token_ids().begin(), u.token_ids().end());
  }
  return run;
}

// The text of `tokens`, special tokens as <id>.
std::string TextOf(const std::vector<int32_t>& tokens) {
  absl::StatusOr<ConstraintVocabulary> v = resume_testing::Vocabulary()();
  EXPECT_TRUE(v.ok()) << v.status();
  if (!v.ok()) return "";
  std::string text;
  for (int32_t t : tokens) {
    const std::string& bytes = v->index->vocab().bytes[t];
    text += bytes.empty() ? "<" + std::to_string(t) + ">" : bytes;
  }
  return text;
}

// ---- random synthetic weights ----

// Biases that lead the random model through short JSON (the grammar decides
// which of them may come where) to its end.
cluster::SubmitSequence Biased(cluster::SubmitSequence s) {
  auto& bias = *s.mutable_sampling()->mutable_logit_bias();
  for (const auto& [text, b] : std::vector<std::pair<std::string, float>>{
           {"\"", 70}, {"}", 60}, {"1", 50}, {"a", 40}, {"get", 30}}) {
    const int32_t token = TokenOf(text);
    EXPECT_GE(token, 0) << text;
    bias[token] = b;
  }
  bias[200002] = 60;  // <|return|>, once the grammar allows it
  bias[200012] = 60;  // <|call|>
  return s;
}

cluster::SubmitSequence Prompt(uint64_t id, uint32_t max_tokens) {
  cluster::SubmitSequence s = resume_testing::Request(max_tokens);
  s.set_request_id(id);
  return s;
}

constexpr char kWeatherUnit[] =
    R"({"type":"object","properties":{"location":{"type":"string","maxLength":8},)"
    R"("unit":{"enum":["celsius"]}},"required":["location","unit"],)"
    R"("additionalProperties":false})";

// A get_weather call the turn must make (one tool: its header is forced
// whole) with arguments of `schema`.
cluster::SubmitSequence ToolCall(cluster::SubmitSequence s, const char* schema = kWeatherUnit) {
  cluster::OutputConstraint* c = s.mutable_constraint();
  c->set_tool_required(true);
  cluster::OutputConstraint::Tool* tool = c->add_tools();
  tool->set_name("get_weather");
  tool->set_constrained(true);
  tool->set_schema_json(schema);
  return s;
}

std::vector<cluster::SubmitSequence> SyntheticRequests() {
  std::vector<cluster::SubmitSequence> submits;
  // JSON answers, greedy and seeded at two temperatures; a tool call.
  submits.push_back(Biased(resume_testing::Constrained(Prompt(1, 40))));
  submits.back().mutable_sampling()->set_temperature(0.0f);
  submits.push_back(Biased(resume_testing::Seeded(resume_testing::Constrained(Prompt(2, 40)), 7)));
  submits.back().mutable_sampling()->set_temperature(0.7f);
  submits.push_back(Biased(resume_testing::Seeded(resume_testing::Constrained(Prompt(3, 40)), 8)));
  submits.push_back(Biased(ToolCall(Prompt(4, 40))));
  submits.back().mutable_sampling()->set_temperature(0.0f);
  submits.push_back(Biased(resume_testing::Seeded(ToolCall(Prompt(5, 40)), 9)));
  return submits;
}

TEST(GrammarDraftsTest, SyntheticTokensAreUnchangedGreedyAndSeeded) {
  const std::vector<cluster::SubmitSequence> submits = SyntheticRequests();
  const Served off = Serve(submits, false);
  const Served on = Serve(submits, true);
  ASSERT_EQ(off.tokens.size(), submits.size());
  EXPECT_EQ(on.tokens, off.tokens);
  EXPECT_EQ(off.counts.drafted, 0u);
  EXPECT_GT(on.counts.grammar_drafted, 0u);
  EXPECT_EQ(on.counts.grammar_drafted, on.counts.drafted);  // no drafter
  EXPECT_LE(on.counts.grammar_accepted, on.counts.grammar_drafted);
  EXPECT_LT(on.steps, off.steps);
  // The tool calls' headers are forced whole and accepted.
  const std::string call = TextOf(on.tokens.at(4));
  EXPECT_NE(call.find("commentary to=functions.get_weather<200003>json<200008>{\"location\":\""),
            std::string::npos)
      << call;
}

// A tensor-parallel pair: every rank takes the forced drafts of the plan.
TEST(GrammarDraftsTest, TensorParallelPairGivesTheSameTokens) {
  const std::vector<cluster::SubmitSequence> submits = SyntheticRequests();
  const Served off = Serve(submits, false, nullptr, {}, 2);
  const Served on = Serve(submits, true, nullptr, {}, 2);
  ASSERT_EQ(off.tokens.size(), submits.size());
  EXPECT_EQ(on.tokens, off.tokens);
  EXPECT_GT(on.counts.grammar_accepted, 0u);
}

// The speculation bound and governor turn drafters off, not forced drafts:
// past --speculative-max-batch the n-gram drafter drafts nothing while the
// grammar's text is still drafted; tokens unchanged.
TEST(GrammarDraftsTest, ForcedDraftsBypassTheSpeculationBound) {
  std::vector<cluster::SubmitSequence> submits;
  for (uint64_t id = 1; id <= 3; ++id) {
    submits.push_back(Biased(resume_testing::Constrained(Prompt(id, 30))));
    submits.back().mutable_sampling()->set_temperature(0.0f);
  }
  const Served off = Serve(submits, false);
  ServeOptions bounded;
  bounded.speculative.method = SpeculativeMethod::kNgram;
  bounded.speculative.num_tokens = 3;
  bounded.speculative_max_batch = 1;
  const Served on = Serve(submits, true, nullptr, bounded);
  EXPECT_EQ(on.tokens, off.tokens);
  EXPECT_GT(on.counts.grammar_drafted, 0u);
  // While three decode together, only forced text is drafted (the n-gram
  // drafter may draft once fewer are left).
  EXPECT_GT(on.counts.grammar_verify_steps, 0u);
}

// ---- the trained demo model ----

const ModelWeights* Demo() {
  static const ModelWeights* weights = []() -> const ModelWeights* {
    absl::StatusOr<std::unique_ptr<ModelSource>> source = ModelSource::Open("synthetic:demo");
    EXPECT_TRUE(source.ok()) << source.status();
    if (!source.ok()) return nullptr;
    absl::StatusOr<ModelWeights> w = (*source)->LoadShard(ShardSpec{});
    EXPECT_TRUE(w.ok()) << w.status();
    return w.ok() ? new ModelWeights(*std::move(w)) : nullptr;
  }();
  return weights;
}

// A chat request for `question`, rendered as the coordinator renders it
// (with the get_weather tool when `tools`).
cluster::SubmitSequence DemoRequest(uint64_t id, const std::string& question, bool tools) {
  std::vector<harmony::Message> conversation(1);
  conversation[0].role = harmony::Role::kSystem;
  conversation[0].system = harmony::SystemContent{};
  if (tools) {
    harmony::Message developer;
    developer.role = harmony::Role::kDeveloper;
    developer.developer = harmony::DeveloperContent{};
    developer.developer->function_tools.push_back(
        {"get_weather", "Get the current weather in a city",
         nlohmann::ordered_json::parse(
             R"({"type":"object","properties":{"location":{"type":"string",)"
             R"("description":"The city, e.g. Paris"}},"required":["location"]})")});
    conversation.push_back(developer);
  }
  harmony::Message user;
  user.role = harmony::Role::kUser;
  user.content = question;
  conversation.push_back(user);
  absl::StatusOr<harmony::RenderedPrompt> rendered = harmony::RenderForCompletion(conversation, {});
  EXPECT_TRUE(rendered.ok()) << rendered.status();
  absl::StatusOr<ConstraintVocabulary> v = resume_testing::Vocabulary()();
  EXPECT_TRUE(v.ok()) << v.status();
  cluster::SubmitSequence s;
  s.set_request_id(id);
  if (rendered.ok() && v.ok()) {
    for (tokenizer::TokenId t : rendered->Tokens(*v->tokenizer)) s.add_prompt_ids(t);
  }
  s.mutable_sampling()->set_max_tokens(96);
  s.mutable_sampling()->add_stop_token_ids(200002);  // <|return|>
  s.mutable_sampling()->add_stop_token_ids(200012);  // <|call|>
  s.mutable_constraint()->set_reasoning_budget(48);
  return s;
}

cluster::SubmitSequence JsonAnswer(uint64_t id, const std::string& question,
                                   const std::string& schema) {
  cluster::SubmitSequence s = DemoRequest(id, question + " Answer in JSON.", false);
  s.mutable_constraint()->set_json_final(true);
  s.mutable_constraint()->set_final_schema_json(schema);
  return s;
}

TEST(GrammarDraftsDemoTest, JsonAnswersAndToolCallsTakeFewerSteps) {
  ASSERT_NE(Demo(), nullptr);
  std::vector<cluster::SubmitSequence> submits = {
      JsonAnswer(1, "How many days are in March?",
                 R"({"type":"object","properties":{"days":{"type":"integer"}},)"
                 R"("required":["days"],"additionalProperties":false})"),
      JsonAnswer(2, "What is the capital of France?",
                 R"({"type":"object","properties":{"country":{"type":"string"},)"
                 R"("capital":{"type":"string"}},"required":["country","capital"],)"
                 R"("additionalProperties":false})"),
      ToolCall(DemoRequest(3, "What's the weather in Paris?", true),
               R"({"type":"object","properties":{"location":{"type":"string"}},)"
               R"("required":["location"],"additionalProperties":false})"),
  };
  for (cluster::SubmitSequence& s : submits) s.mutable_sampling()->set_temperature(0.0f);
  // The same requests seeded.
  for (uint64_t id = 1; id <= 3; ++id) {
    cluster::SubmitSequence s = resume_testing::Seeded(submits[id - 1], 11 * id);
    s.set_request_id(10 + id);
    s.mutable_sampling()->set_temperature(0.8f);
    submits.push_back(s);
  }
  // One request at a time, so that steps count one answer's decode steps.
  for (const cluster::SubmitSequence& s : submits) {
    SCOPED_TRACE(s.request_id());
    const Served off = Serve({s}, false, Demo());
    const Served on = Serve({s}, true, Demo());
    ASSERT_EQ(off.tokens.size(), 1u);
    EXPECT_EQ(on.tokens, off.tokens);
    const std::vector<int32_t>& tokens = off.tokens.begin()->second;
    std::cout << "request " << s.request_id() << ": " << tokens.size() << " tokens, steps "
              << off.steps << " -> " << on.steps << " (forced drafts: " << on.counts.grammar_drafted
              << " drafted, " << on.counts.grammar_accepted << " accepted in "
              << on.counts.grammar_verify_steps << " verification steps)\n  " << TextOf(tokens)
              << "\n";
    // The JSON or the call's arguments, its header and its end token are
    // mostly forced text: a real reduction in steps. Each accepted token
    // saves a step, but for an accepted stop token that ends the answer
    // (the token drawn after it is not needed).
    EXPECT_GE(on.counts.grammar_accepted, 5u);
    EXPECT_LE(on.steps + 4, off.steps);
    EXPECT_GE(off.steps - on.steps + 1, static_cast<int>(on.counts.grammar_accepted));
    EXPECT_LE(off.steps - on.steps, static_cast<int>(on.counts.grammar_accepted));
  }
}

}  // namespace
}  // namespace flotilla::worker
