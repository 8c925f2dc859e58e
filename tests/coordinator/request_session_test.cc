// RequestSession against a scripted fake cluster: which sequences it submits
// and when (the n choices of a prompt after its first token, so they share
// its cached KV blocks), their seeds, the typed events of recorded text and
// Harmony token sequences, stop strings, cancel, deadline, refusals.
#include "coordinator/request_session.h"

#include <gtest/gtest.h>

#include <map>

#include "common/harmony/renderer.h"
#include "tests/coordinator/fake_backend.h"
#include "tests/harmony_completion.h"

namespace flotilla::coordinator {
namespace {

namespace tk = tokenizer;
using Kind = RequestEvent::Kind;

using test_support::Tok;

using test_support::Encode;

using test_support::FakeBackend;

// Collects what the session emits.
struct Events {
  std::vector<RequestEvent> all;
  RequestSession::Sink Sink() {
    return [this](const std::vector<RequestEvent>& events) {
      for (const RequestEvent& e : events) {
        all.push_back(e);
        all.back().update = nullptr;  // valid only during the call
      }
    };
  }
  // The concatenated text of `kind` events of one choice.
  std::string Text(Kind kind, uint32_t choice) const {
    std::string text;
    for (const RequestEvent& e : all) {
      if (e.kind == kind && e.choice == choice) text += e.text;
    }
    return text;
  }
  const RequestEvent* Find(Kind kind, uint32_t choice = 0) const {
    for (const RequestEvent& e : all) {
      if (e.kind == kind && e.choice == choice) return &e;
    }
    return nullptr;
  }
  int Count(Kind kind) const {
    int n = 0;
    for (const RequestEvent& e : all) n += e.kind == kind;
    return n;
  }
};

SessionRequest TextRequest(std::vector<std::vector<tk::TokenId>> prompts, uint32_t n) {
  SessionRequest r;
  r.decoding = Decoding::kText;
  r.prompts = std::move(prompts);
  r.n = n;
  r.call_id_seed = "cmpl-test";
  return r;
}

TEST(RequestSessionTest, ChoicesOfAPromptFollowItsFirstTokenWithTheirOwnSeeds) {
  FakeBackend cluster;
  Events events;
  SessionRequest request = TextRequest({Encode("one"), Encode("two")}, 3);
  request.submit.mutable_sampling()->set_seed(100);
  auto session = RequestSession::Start(&cluster, &Tok(), request, events.Sink());
  ASSERT_TRUE(session.ok()) << session.status();
  EXPECT_EQ((*session)->choices(), 6u);
  // Only the first choice of each prompt: the others wait for its prompt's blocks.
  ASSERT_EQ(cluster.sequences.size(), 2u);
  EXPECT_EQ(cluster.Prompt(1), Encode("one"));
  EXPECT_EQ(cluster.Prompt(2), Encode("two"));

  cluster.Update(1, Encode(" a"));  // prompt 0's first token: its siblings go now
  ASSERT_EQ(cluster.sequences.size(), 4u);
  EXPECT_EQ(cluster.Prompt(3), Encode("one"));
  EXPECT_EQ(cluster.Prompt(4), Encode("one"));
  EXPECT_EQ(cluster.sequences[1].request.sampling().seed(), 100u);
  EXPECT_EQ(cluster.sequences[3].request.sampling().seed(), 101u);
  EXPECT_EQ(cluster.sequences[4].request.sampling().seed(), 102u);
  cluster.Update(2, Encode(" b"));
  ASSERT_EQ(cluster.sequences.size(), 6u);
  EXPECT_EQ(cluster.Prompt(6), Encode("two"));
  EXPECT_EQ(cluster.sequences[6].request.sampling().seed(), 102u);

  // Sequence -> choice: 1->0, 3->1, 4->2, 2->3, 5->4, 6->5.
  const std::map<uint64_t, uint32_t> choice = {{1, 0}, {3, 1}, {4, 2}, {2, 3}, {5, 4}, {6, 5}};
  for (const auto& [id, index] : choice) {
    cluster.Update(id, Encode(" x" + std::to_string(index)), common::LENGTH, std::nullopt,
                   id <= 2 ? 2 : 1);
    cluster.Done(id);
  }
  EXPECT_EQ(events.Text(Kind::kContent, 0), " a x0");
  EXPECT_EQ(events.Text(Kind::kContent, 3), " b x3");
  EXPECT_EQ(events.Text(Kind::kContent, 4), " x4");
  for (uint32_t c = 0; c < 6; ++c) {
    const RequestEvent* finish = events.Find(Kind::kFinish, c);
    ASSERT_NE(finish, nullptr) << c;
    EXPECT_EQ(finish->finish_reason, "length");
  }
  ASSERT_EQ(events.all.back().kind, Kind::kUsage);
  EXPECT_EQ(events.all.back().usage.prompt_tokens, Encode("one").size() + Encode("two").size());
  EXPECT_EQ(events.all.back().usage.completion_tokens, 2u * 2 + 4u * 1);
  EXPECT_EQ(events.Count(Kind::kUsage) + events.Count(Kind::kError), 1);
}

TEST(RequestSessionTest, StopStringEndsTheChoiceAndCancelsItsSequence) {
  FakeBackend cluster;
  Events events;
  SessionRequest request = TextRequest({Encode("count")}, 1);
  request.stop = {" three"};
  auto session = RequestSession::Start(&cluster, &Tok(), request, events.Sink());
  ASSERT_TRUE(session.ok());
  cluster.Update(1, Encode(" one two"));
  cluster.Update(1, Encode(" three four"));
  EXPECT_EQ(cluster.sequences[1].cancelled, kStopStringCancel);
  cluster.Update(1, Encode(" five"));  // late tokens are ignored
  EXPECT_EQ(events.Text(Kind::kContent, 0), " one two");
  const RequestEvent* finish = events.Find(Kind::kFinish);
  ASSERT_NE(finish, nullptr);
  EXPECT_TRUE(finish->stopped_by_string);
  EXPECT_EQ(finish->finish_reason, "stop");
  EXPECT_EQ(events.all.back().kind, Kind::kUsage);
}

TEST(RequestSessionTest, CancelFailsTheRequestAndCancelsEverySequence) {
  FakeBackend cluster;
  Events events;
  bool released = false;
  SessionHooks hooks;
  hooks.on_all_released = [&released] { released = true; };
  auto session =
      RequestSession::Start(&cluster, &Tok(), TextRequest({Encode("hi")}, 2), events.Sink(), hooks);
  ASSERT_TRUE(session.ok());
  cluster.Update(1, Encode(" there"));
  ASSERT_EQ(cluster.sequences.size(), 2u);
  (*session)->Cancel("the client went away");
  EXPECT_EQ(cluster.sequences[1].cancelled, "the client went away");
  EXPECT_EQ(cluster.sequences[2].cancelled, "the client went away");
  ASSERT_EQ(events.all.back().kind, Kind::kError);
  EXPECT_EQ(events.all.back().status.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(events.all.back().usage.completion_tokens, Encode(" there").size());
  EXPECT_TRUE(released);
  EXPECT_EQ(events.Count(Kind::kError), 1);
}

TEST(RequestSessionTest, ACancelByIdOfOneSequenceEndsThemAll) {
  FakeBackend cluster;
  Events events;
  auto session =
      RequestSession::Start(&cluster, &Tok(), TextRequest({Encode("hi")}, 2), events.Sink());
  ASSERT_TRUE(session.ok());
  cluster.Update(1, Encode(" there"));
  cluster.Cancel(1, "Cancel by the client");
  EXPECT_EQ(cluster.sequences[2].cancelled, "Cancel by the client");
  ASSERT_EQ(events.all.back().kind, Kind::kError);
  EXPECT_EQ(events.all.back().status.code(), absl::StatusCode::kCancelled);
}

TEST(RequestSessionTest, DeadlineBackstopAndWorkerErrors) {
  FakeBackend cluster;
  Events events;
  std::function<void()> timer;
  absl::Duration delay;
  SessionHooks hooks;
  hooks.after = [&](absl::Duration d, std::function<void()> f) {
    delay = d;
    timer = std::move(f);
  };
  SessionRequest request = TextRequest({Encode("hi")}, 1);
  request.deadline = absl::Now() + absl::Seconds(5);
  auto session = RequestSession::Start(&cluster, &Tok(), request, events.Sink(), hooks);
  ASSERT_TRUE(session.ok());
  EXPECT_GT(cluster.sequences[1].request.deadline_unix_ms(), 0);
  ASSERT_TRUE(timer);
  EXPECT_GT(delay, absl::Seconds(5));
  timer();
  EXPECT_EQ(cluster.sequences[1].cancelled, "the request's deadline passed");
  EXPECT_EQ(events.all.back().status.code(), absl::StatusCode::kDeadlineExceeded);

  // A sequence that ends without a finish reason fails the request.
  Events other;
  auto lost = RequestSession::Start(&cluster, &Tok(), TextRequest({Encode("hi")}, 1), other.Sink());
  ASSERT_TRUE(lost.ok());
  cluster.Done(2, absl::UnavailableError("worker w1 is gone"));
  ASSERT_EQ(other.all.size(), 1u);
  EXPECT_EQ(other.all.back().status.code(), absl::StatusCode::kUnavailable);
}

TEST(RequestSessionTest, ARefusedPromptRefusesTheRequestAndCancelsTheOthers) {
  FakeBackend cluster;
  cluster.refuse_after = 1;
  Events events;
  auto session = RequestSession::Start(&cluster, &Tok(), TextRequest({Encode("a"), Encode("b")}, 1),
                                       events.Sink());
  ASSERT_FALSE(session.ok());
  EXPECT_EQ(session.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_FALSE(cluster.sequences[1].cancelled.empty());
  EXPECT_TRUE(events.all.empty());
}

TEST(RequestSessionTest, EchoPrecedesEachChoice) {
  FakeBackend cluster;
  Events events;
  SessionRequest request = TextRequest({Encode("Say hi")}, 2);
  request.echo = true;
  auto session = RequestSession::Start(&cluster, &Tok(), request, events.Sink());
  ASSERT_TRUE(session.ok());
  cluster.Update(1, Encode(" hi"), common::STOP, 200002, 1);
  cluster.Update(2, Encode(" yo"), common::STOP, 200002, 1);
  EXPECT_EQ(events.Text(Kind::kContent, 0), "Say hi hi");
  EXPECT_EQ(events.Text(Kind::kContent, 1), "Say hi yo");
  EXPECT_EQ(events.all.back().kind, Kind::kUsage);
}

TEST(RequestSessionTest, HarmonyTokensBecomeReasoningContentAndToolCalls) {
  harmony::RenderedPrompt p;
  harmony::Message thought;
  thought.role = harmony::Role::kAssistant;
  thought.channel = "analysis";
  thought.content = "Need weather.";
  harmony::Message call = thought;
  call.channel = "commentary";
  call.recipient = "functions.get_weather";
  call.content_type = "<|constrain|>json";
  call.content = R"({"city":"Paris"})";
  ASSERT_TRUE(harmony::RenderMessage(thought, true, p).ok());
  ASSERT_TRUE(harmony::RenderMessage(call, true, p).ok());
  std::vector<tk::TokenId> ids = p.Tokens(Tok());
  const size_t role = Tok().EncodeOrdinary("assistant")->size();
  ids.erase(ids.begin(), ids.begin() + 1 + role);  // the prompt ends in <|start|>assistant
  const tk::TokenId stop = ids.back();
  ids.pop_back();

  FakeBackend cluster;
  Events events;
  SessionRequest request = TextRequest({Encode("prompt")}, 1);
  request.decoding = Decoding::kHarmony;
  request.call_id_seed = "chatcmpl-x";
  auto session = RequestSession::Start(&cluster, &Tok(), request, events.Sink());
  ASSERT_TRUE(session.ok());
  for (tk::TokenId t : ids) cluster.Update(1, {t});
  cluster.Update(1, {}, common::STOP, stop, static_cast<uint32_t>(ids.size() + 1));
  EXPECT_EQ(events.Text(Kind::kReasoning, 0), "Need weather.");
  EXPECT_EQ(events.Text(Kind::kContent, 0), "");
  std::string name, arguments, call_id;
  for (const RequestEvent& e : events.all) {
    if (e.kind != Kind::kToolCall) continue;
    EXPECT_EQ(e.tool_call.index, 0u);
    name += e.tool_call.name;
    call_id += e.tool_call.id;
    arguments += e.tool_call.arguments;
  }
  EXPECT_EQ(name, "get_weather");
  EXPECT_FALSE(call_id.empty());
  EXPECT_EQ(arguments, R"({"city":"Paris"})");
  const RequestEvent* finish = events.Find(Kind::kFinish);
  ASSERT_NE(finish, nullptr);
  EXPECT_EQ(finish->finish_reason, "tool_calls");
  EXPECT_EQ(events.all.back().kind, Kind::kUsage);
  // Where each message begins and ends, for the APIs whose output is per message.
  std::vector<std::pair<Kind, Kind>> messages;
  for (const RequestEvent& e : events.all) {
    if (e.kind == Kind::kMessageStart || e.kind == Kind::kMessageEnd) {
      messages.emplace_back(e.kind, e.kind == Kind::kMessageStart ? e.message_kind : e.kind);
    }
  }
  EXPECT_EQ(messages, (std::vector<std::pair<Kind, Kind>>{{Kind::kMessageStart, Kind::kReasoning},
                                                          {Kind::kMessageEnd, Kind::kMessageEnd},
                                                          {Kind::kMessageStart, Kind::kToolCall},
                                                          {Kind::kMessageEnd, Kind::kMessageEnd}}));
  // The analysis message's content tokens and its end token.
  const uint32_t reasoning = static_cast<uint32_t>(Encode("Need weather.").size() + 1);
  EXPECT_EQ(finish->usage.reasoning_tokens, reasoning);
  EXPECT_EQ(events.all.back().usage.reasoning_tokens, reasoning);
}

}  // namespace
}  // namespace flotilla::coordinator
