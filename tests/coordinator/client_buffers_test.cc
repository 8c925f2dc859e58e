// ClientBuffers' bounds on bytes queued toward clients, on a fake clock (the
// watchdog is off; the test calls Sweep with chosen times).
#include "coordinator/client_buffers.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "coordinator/grpc/prompt_logits_credit.h"

namespace flotilla::coordinator {
namespace {

// A stream's owner that records what the bounds did to it.
struct FakeStream : BufferedStream {
  void EndStalled(const absl::Status& status) override { ended.push_back(status); }
  void Drop() override { ++drops; }
  std::vector<absl::Status> ended;
  int drops = 0;
};

const absl::Time kT0 = absl::FromUnixSeconds(1000);

// Small bounds on a clock that stands at kT0 (Sweep is given the time).
ClientBufferOptions Options() {
  ClientBufferOptions o;
  o.max_stream_bytes = 1000;
  o.max_total_bytes = 10000;
  o.stall_grace = absl::Seconds(2);
  o.max_open_requests = 2;
  o.clock = [] { return kT0; };
  return o;
}

TEST(ClientBuffers, AStreamOverItsBoundPastTheGraceIsEndedThenDropped) {
  auto buffers = ClientBuffers::Create(Options(), /*start_watchdog=*/false);
  auto stream = std::make_shared<FakeStream>();
  std::unique_ptr<StreamAccount> account = buffers->Open(stream);
  account->Add(1500);
  EXPECT_EQ(buffers->queued(), 1500u);
  buffers->Sweep(kT0);
  buffers->Sweep(kT0 + absl::Seconds(1));
  EXPECT_TRUE(stream->ended.empty()) << "within its grace";
  buffers->Sweep(kT0 + absl::Seconds(2));
  ASSERT_EQ(stream->ended.size(), 1u);
  EXPECT_EQ(stream->ended[0].code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(stream->ended[0].message().find("--max-stream-buffer-bytes"), std::string::npos)
      << stream->ended[0];
  EXPECT_EQ(buffers->streams_ended(), 1u);
  // Still holding bytes a grace later: the client takes nothing, dropped once.
  buffers->Sweep(kT0 + absl::Seconds(3));
  EXPECT_EQ(stream->drops, 0);
  buffers->Sweep(kT0 + absl::Seconds(4));
  buffers->Sweep(kT0 + absl::Seconds(9));
  EXPECT_EQ(stream->drops, 1);
  EXPECT_EQ(stream->ended.size(), 1u);
  account.reset();
  EXPECT_EQ(buffers->queued(), 0u);
}

TEST(ClientBuffers, AClientThatCatchesUpWithinTheGraceKeepsItsStream) {
  auto buffers = ClientBuffers::Create(Options(), false);
  auto stream = std::make_shared<FakeStream>();
  std::unique_ptr<StreamAccount> account = buffers->Open(stream);
  account->Add(1500);
  buffers->Sweep(kT0);
  account->Remove(1000);  // read
  buffers->Sweep(kT0 + absl::Seconds(1));
  account->Add(1000);  // over again: a new grace
  buffers->Sweep(kT0 + absl::Seconds(2));
  buffers->Sweep(kT0 + absl::Seconds(3));
  EXPECT_TRUE(stream->ended.empty());
  buffers->Sweep(kT0 + absl::Seconds(4));
  EXPECT_EQ(stream->ended.size(), 1u);
}

// Over the global bound, the streams whose clients would take longest to
// drain them go first (one that takes nothing never drains), the largest of
// those first, until the total is under the bound; a client that reads fast
// keeps its stream however much it holds.
TEST(ClientBuffers, UnderGlobalPressureTheStreamsThatDoNotDrainAreShed) {
  ClientBufferOptions o = Options();
  o.max_total_bytes = 2000;
  auto buffers = ClientBuffers::Create(o, false);
  std::vector<std::shared_ptr<FakeStream>> streams;
  std::vector<std::unique_ptr<StreamAccount>> accounts;
  for (size_t queued : {900, 800, 1300, 100}) {
    streams.push_back(std::make_shared<FakeStream>());
    accounts.push_back(buffers->Open(streams.back()));
    accounts.back()->Add(queued);
  }
  EXPECT_EQ(buffers->queued(), 3100u);
  EXPECT_TRUE(buffers->Admit().ok()) << "new requests are not refused for what others hold";
  // No pace is known yet: nothing is shed on a guess.
  buffers->Sweep(kT0);
  for (const auto& s : streams) EXPECT_TRUE(s->ended.empty());
  // Stream 2 reads 4000 bytes a second (and is sent as much): it drains its
  // 1300 in a third of a second. The others take nothing.
  accounts[2]->Add(2000);
  accounts[2]->Remove(2000);
  buffers->Sweep(kT0 + absl::Milliseconds(500));
  ASSERT_EQ(streams[0]->ended.size(), 1u);
  EXPECT_NE(streams[0]->ended[0].message().find("--max-client-buffer-bytes"), std::string::npos);
  EXPECT_EQ(streams[1]->ended.size(), 1u) << "3100 - 900 is still over 2000";
  EXPECT_TRUE(streams[2]->ended.empty()) << "a fast reader is not shed";
  EXPECT_TRUE(streams[3]->ended.empty()) << "1400 is under the bound";
  // Still over while the ended streams hold their bytes: dropped at once.
  buffers->Sweep(kT0 + absl::Milliseconds(501));
  EXPECT_EQ(streams[0]->drops, 1);
  EXPECT_EQ(streams[1]->drops, 1);
  accounts[0].reset();
  accounts[1].reset();
  EXPECT_EQ(buffers->queued(), 1400u);
}

TEST(ClientBuffers, OpenRequestsAreBoundedUntilTheirTokensGo) {
  auto buffers = ClientBuffers::Create(Options(), false);
  absl::StatusOr<std::shared_ptr<void>> a = buffers->Admit();
  absl::StatusOr<std::shared_ptr<void>> b = buffers->Admit();
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(buffers->open_requests(), 2);
  absl::StatusOr<std::shared_ptr<void>> c = buffers->Admit();
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("--max-inflight"), std::string::npos) << c.status();
  a->reset();
  EXPECT_EQ(buffers->open_requests(), 1);
  EXPECT_TRUE(buffers->Admit().ok());
}

TEST(ClientBuffers, AnOwnerThatWentAwayIsNeverCalled) {
  auto buffers = ClientBuffers::Create(Options(), false);
  auto stream = std::make_shared<FakeStream>();
  std::unique_ptr<StreamAccount> account = buffers->Open(stream);
  account->Add(1500);
  stream.reset();
  buffers->Sweep(kT0);
  buffers->Sweep(kT0 + absl::Seconds(5));  // nothing to call: no crash
  account.reset();
  EXPECT_EQ(buffers->queued(), 0u);
}

// The watchdog thread applies the grace by itself.
TEST(ClientBuffers, TheWatchdogEndsAStalledStream) {
  ClientBufferOptions o = Options();
  o.stall_grace = absl::Milliseconds(50);
  o.clock = [] { return absl::Now(); };
  auto buffers = ClientBuffers::Create(o);
  auto stream = std::make_shared<FakeStream>();
  std::unique_ptr<StreamAccount> account = buffers->Open(stream);
  account->Add(1500);
  for (int i = 0; i < 1000 && buffers->streams_ended() == 0; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(buffers->streams_ended(), 1u);
}

// A stream whose producer waits for its client (a sequence paused at its
// prompt-logits credit) holds less than its bound, yet is ended once its
// client has taken nothing for the grace; anything taken starts the grace
// again, and a stream whose producer does not wait is never ended under its
// bound.
TEST(ClientBuffers, AStreamWhoseProducerWaitsIsEndedWhenItsClientTakesNothingForTheGrace) {
  auto now = std::make_shared<absl::Time>(kT0);
  ClientBufferOptions o = Options();
  o.clock = [now] { return *now; };
  auto buffers = ClientBuffers::Create(o, false);
  auto waiting = std::make_shared<FakeStream>();
  auto idle = std::make_shared<FakeStream>();
  std::unique_ptr<StreamAccount> account = buffers->Open(waiting);
  std::unique_ptr<StreamAccount> other = buffers->Open(idle);
  account->Add(600);
  other->Add(600);
  account->SetProducerWaiting(true);
  *now = kT0 + absl::Seconds(1.5);
  account->Remove(100);  // the client took some: the grace starts again
  buffers->Sweep(*now);
  *now = kT0 + absl::Seconds(3);
  buffers->Sweep(*now);
  EXPECT_TRUE(waiting->ended.empty()) << "it took something 1.5 s ago";
  *now = kT0 + absl::Seconds(3.5);
  buffers->Sweep(*now);
  ASSERT_EQ(waiting->ended.size(), 1u);
  EXPECT_EQ(waiting->ended[0].code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(waiting->ended[0].message().find("prompt-logits credit"), std::string::npos)
      << waiting->ended[0];
  EXPECT_TRUE(idle->ended.empty()) << "under its bound, nothing waits for it";

  // The producer stopped waiting (more credit came): no grace runs.
  auto resumed = std::make_shared<FakeStream>();
  std::unique_ptr<StreamAccount> third = buffers->Open(resumed);
  third->Add(600);
  third->SetProducerWaiting(true);
  third->SetProducerWaiting(false);
  *now = kT0 + absl::Seconds(30);
  buffers->Sweep(*now);
  EXPECT_TRUE(resumed->ended.empty());
}

// Credit per sequence: the window at first, then what the client took plus
// the window; a sequence waits once it sent all its credit, until the client
// takes more or its prompt logits are complete.
TEST(PromptLogitsCredit, GrantsWhatTheClientTookPlusTheWindow) {
  PromptLogitsCredit credit(100);
  EXPECT_EQ(credit.window(), 100u);
  EXPECT_FALSE(credit.waiting());
  credit.Received(7, 60, false);
  EXPECT_FALSE(credit.waiting());
  credit.Received(7, 60, false);  // 120 sent: one row past its window
  EXPECT_TRUE(credit.waiting());
  credit.Received(8, 40, false);  // another sequence of the stream
  EXPECT_EQ(credit.Taken(7, 60), 160u);
  EXPECT_FALSE(credit.waiting()) << "7 may send 40 more, 8 did not send its window";
  EXPECT_EQ(credit.Taken(7, 0), 0u) << "the credit did not grow";
  credit.Received(7, 60, false);
  EXPECT_TRUE(credit.waiting());
  EXPECT_EQ(credit.Taken(7, 60), 220u);
  credit.Received(7, 60, true);  // the last rows, with the first token
  EXPECT_FALSE(credit.waiting()) << "its prompt logits are complete";
  EXPECT_EQ(credit.Taken(7, 60), 0u) << "nothing more to grant";
  EXPECT_EQ(credit.Taken(8, 40), 140u);
  EXPECT_EQ(PromptLogitsCredit(0).window(), 1u);
}

}  // namespace
}  // namespace flotilla::coordinator
