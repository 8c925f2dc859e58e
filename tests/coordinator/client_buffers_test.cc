// ClientBuffers' bounds on bytes queued toward clients, on a fake clock (the
// watchdog is off; the test calls Sweep with chosen times).
#include "coordinator/client_buffers.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

namespace flotilla::coordinator {
namespace {

// A stream's owner that records what the bounds did to it.
struct FakeStream : BufferedStream {
  void EndStalled(const absl::Status& status) override { ended.push_back(status); }
  void Drop() override { ++drops; }
  std::vector<absl::Status> ended;
  int drops = 0;
};

ClientBufferOptions Options() {
  ClientBufferOptions o;
  o.max_stream_bytes = 1000;
  o.max_total_bytes = 10000;
  o.stall_grace = absl::Seconds(2);
  o.max_open_requests = 2;
  return o;
}

const absl::Time kT0 = absl::FromUnixSeconds(1000);

TEST(ClientBuffers, AStreamOverItsBoundPastTheGraceIsEndedThenDropped) {
  auto buffers = ClientBuffers::Create(Options(), /*start_watchdog=*/false);
  auto stream = std::make_shared<FakeStream>();
  std::unique_ptr<StreamAccount> account = buffers->Open(stream);
  ASSERT_TRUE(account->Add(1500));
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
  ASSERT_TRUE(account->Add(1500));
  buffers->Sweep(kT0);
  account->Remove(1000);  // read
  buffers->Sweep(kT0 + absl::Seconds(1));
  ASSERT_TRUE(account->Add(1000));  // over again: a new grace
  buffers->Sweep(kT0 + absl::Seconds(2));
  buffers->Sweep(kT0 + absl::Seconds(3));
  EXPECT_TRUE(stream->ended.empty());
  buffers->Sweep(kT0 + absl::Seconds(4));
  EXPECT_EQ(stream->ended.size(), 1u);
}

TEST(ClientBuffers, AStreamOverTheGlobalBoundByItselfIsRefusedAndEndedAtOnce) {
  auto buffers = ClientBuffers::Create(Options(), false);
  auto stream = std::make_shared<FakeStream>();
  std::unique_ptr<StreamAccount> account = buffers->Open(stream);
  ASSERT_TRUE(account->Add(9900)) << "a burst over its own bound waits for the grace";
  EXPECT_FALSE(account->Add(200));
  EXPECT_TRUE(account->overflowed());
  EXPECT_EQ(account->queued(), 9900u) << "refused bytes are not counted";
  // Not refusable (a whole response made at once): counted all the same.
  EXPECT_TRUE(account->Add(200, /*may_refuse=*/false));
  EXPECT_EQ(account->queued(), 10100u);
  buffers->Sweep(kT0);
  ASSERT_EQ(stream->ended.size(), 1u);
  EXPECT_EQ(stream->ended[0].code(), absl::StatusCode::kResourceExhausted);
}

TEST(ClientBuffers, OverTheGlobalBoundTheLargestStreamsAreShed) {
  ClientBufferOptions o = Options();
  o.max_total_bytes = 2000;
  auto buffers = ClientBuffers::Create(o, false);
  std::vector<std::shared_ptr<FakeStream>> streams;
  std::vector<std::unique_ptr<StreamAccount>> accounts;
  for (size_t queued : {900, 800, 700, 100}) {
    streams.push_back(std::make_shared<FakeStream>());
    accounts.push_back(buffers->Open(streams.back()));
    ASSERT_TRUE(accounts.back()->Add(queued));
  }
  EXPECT_EQ(buffers->queued(), 2500u);
  EXPECT_TRUE(buffers->Admit().ok()) << "new requests are not refused for what others hold";
  // None is over its own bound; the largest goes, and that is enough.
  buffers->Sweep(kT0);
  ASSERT_EQ(streams[0]->ended.size(), 1u);
  EXPECT_NE(streams[0]->ended[0].message().find("--max-client-buffer-bytes"), std::string::npos);
  for (size_t i = 1; i < streams.size(); ++i) EXPECT_TRUE(streams[i]->ended.empty()) << i;
  // Still over: the ended stream that still holds its bytes is dropped at once.
  buffers->Sweep(kT0 + absl::Milliseconds(1));
  EXPECT_EQ(streams[0]->drops, 1);
  accounts[0].reset();  // the dropped stream lets its bytes go
  EXPECT_EQ(buffers->queued(), 1600u);
  buffers->Sweep(kT0 + absl::Milliseconds(2));
  for (size_t i = 1; i < streams.size(); ++i) EXPECT_TRUE(streams[i]->ended.empty()) << i;
}

TEST(ClientBuffers, AStreamMayAlwaysHoldOneMessage) {
  auto buffers = ClientBuffers::Create(Options(), false);
  auto stream = std::make_shared<FakeStream>();
  std::unique_ptr<StreamAccount> account = buffers->Open(stream);
  EXPECT_TRUE(account->Add(50000)) << "one message over every bound, nothing else queued";
  EXPECT_FALSE(account->Add(1));
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
  ASSERT_TRUE(account->Add(1500));
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
  auto buffers = ClientBuffers::Create(o);
  auto stream = std::make_shared<FakeStream>();
  std::unique_ptr<StreamAccount> account = buffers->Open(stream);
  ASSERT_TRUE(account->Add(1500));
  for (int i = 0; i < 1000 && buffers->streams_ended() == 0; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(buffers->streams_ended(), 1u);
}

}  // namespace
}  // namespace flotilla::coordinator
