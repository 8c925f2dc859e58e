// The threads the gRPC client streams decode on. A worker's update reaches a
// RequestSession on the thread of that worker's Session stream; with
// DecodePool::Runner as the session's SessionHooks::run, the session's
// decoding (Harmony parsing, detokenizing, stop strings) and its sink (the
// reply messages) run here instead, so one slow or large request never holds
// up the updates of every other request on that worker. RequestSession runs
// one task of a session at a time, so a session's events stay in order.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace flotilla::coordinator {

class DecodePool {
 public:
  // Starts `threads` threads (at least one).
  explicit DecodePool(size_t threads);
  // Runs every task already posted, then joins the threads. A task posted
  // after that (a session outliving the pool) runs on the posting thread.
  ~DecodePool();
  DecodePool(const DecodePool&) = delete;
  DecodePool& operator=(const DecodePool&) = delete;

  // Queues `task` to run on one of the pool's threads.
  void Post(std::function<void()> task);
  // Post as a SessionHooks::run (safe to call after the pool is gone).
  std::function<void(std::function<void()>)> Runner() const;

  size_t threads() const { return threads_.size(); }
  // The default size: half the hardware threads, at least 1, at most 8.
  static size_t DefaultThreads();

 private:
  // The queue, shared with the threads and the runners.
  struct Queue {
    std::mutex mu;
    std::condition_variable wake;
    std::deque<std::function<void()>> tasks;  // under mu
    bool stopping = false;                    // under mu
  };
  static void PostTo(Queue& queue, std::function<void()> task);
  static void Loop(std::shared_ptr<Queue> queue);

  std::shared_ptr<Queue> queue_ = std::make_shared<Queue>();
  std::vector<std::thread> threads_;
};

}  // namespace flotilla::coordinator
