// DecodePool, the threads the gRPC client streams decode on: every posted
// task runs, on a pool thread; a task posted once the pool is gone runs on
// the posting thread; and a RequestSession given the pool as its
// SessionHooks::run decodes and calls its sink there, in order, not on the
// thread that delivered the worker's update.
#include "coordinator/grpc/decode_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <set>
#include <thread>

#include "coordinator/request_session.h"
#include "tests/coordinator/fake_backend.h"
#include "tests/harmony_completion.h"

namespace flotilla::coordinator {
namespace {

using test_support::FakeBackend;
using test_support::Tok;

TEST(DecodePoolTest, EveryPostedTaskRunsOnAPoolThreadBeforeThePoolIsGone) {
  std::atomic<int> ran{0};
  std::mutex mu;
  std::set<std::thread::id> threads;
  {
    DecodePool pool(3);
    EXPECT_EQ(pool.threads(), 3u);
    for (int i = 0; i < 200; ++i) {
      pool.Post([&] {
        std::lock_guard<std::mutex> lock(mu);
        threads.insert(std::this_thread::get_id());
        ++ran;
      });
    }
  }
  EXPECT_EQ(ran.load(), 200);
  EXPECT_EQ(threads.count(std::this_thread::get_id()), 0u);
  EXPECT_LE(threads.size(), 3u);
}

TEST(DecodePoolTest, ARunnerThatOutlivesThePoolRunsItsTaskOnTheCaller) {
  std::function<void(std::function<void()>)> run;
  {
    DecodePool pool(1);
    run = pool.Runner();
  }
  std::thread::id where;
  run([&] { where = std::this_thread::get_id(); });
  EXPECT_EQ(where, std::this_thread::get_id());
}

TEST(DecodePoolTest, ZeroThreadsMeansOne) { EXPECT_EQ(DecodePool(0).threads(), 1u); }

TEST(DecodePoolTest, ASessionDecodesOnThePoolInOrder) {
  DecodePool pool(2);
  FakeBackend cluster;
  std::mutex mu;
  std::string text;
  std::set<std::thread::id> sink_threads;
  std::promise<RequestEvent::Kind> ended;
  SessionRequest request;
  request.decoding = Decoding::kText;
  request.prompts = {*Tok().EncodeOrdinary("count")};
  SessionHooks hooks;
  hooks.run = pool.Runner();
  auto session = RequestSession::Start(
      &cluster, &Tok(), request,
      [&](const std::vector<RequestEvent>& events) {
        std::lock_guard<std::mutex> lock(mu);
        sink_threads.insert(std::this_thread::get_id());
        for (const RequestEvent& e : events) {
          if (e.kind == RequestEvent::Kind::kContent) text += e.text;
          if (e.kind == RequestEvent::Kind::kUsage || e.kind == RequestEvent::Kind::kError) {
            ended.set_value(e.kind);
          }
        }
      },
      hooks);
  ASSERT_TRUE(session.ok()) << session.status();
  std::future<RequestEvent::Kind> end = ended.get_future();
  const char* const pieces[] = {" one", " two", " three", " four", " five"};
  for (const char* piece : pieces) cluster.Update(1, *Tok().EncodeOrdinary(piece));
  cluster.Update(1, *Tok().EncodeOrdinary(" six"), common::LENGTH, std::nullopt, 6);
  cluster.Done(1);
  EXPECT_EQ(end.get(), RequestEvent::Kind::kUsage);
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(text, " one two three four five six");
  EXPECT_FALSE(sink_threads.empty());
  EXPECT_EQ(sink_threads.count(std::this_thread::get_id()), 0u);
}

}  // namespace
}  // namespace flotilla::coordinator
