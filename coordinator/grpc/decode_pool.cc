#include "coordinator/grpc/decode_pool.h"

#include <algorithm>
#include <utility>

namespace flotilla::coordinator {

DecodePool::DecodePool(size_t threads) {
  threads = std::max<size_t>(threads, 1);
  threads_.reserve(threads);
  for (size_t i = 0; i < threads; ++i) threads_.emplace_back(Loop, queue_);
}

DecodePool::~DecodePool() {
  {
    std::lock_guard<std::mutex> lock(queue_->mu);
    queue_->stopping = true;
  }
  queue_->wake.notify_all();
  for (std::thread& t : threads_) {
    // The last owner may be a task on one of the threads: that thread ends
    // by itself once the queue is empty (it holds the queue).
    if (t.get_id() == std::this_thread::get_id()) {
      t.detach();
    } else {
      t.join();
    }
  }
}

void DecodePool::Post(std::function<void()> task) { PostTo(*queue_, std::move(task)); }

std::function<void(std::function<void()>)> DecodePool::Runner() const {
  return [queue = queue_](std::function<void()> task) { PostTo(*queue, std::move(task)); };
}

size_t DecodePool::DefaultThreads() {
  const size_t hardware = std::thread::hardware_concurrency();
  return std::clamp<size_t>(hardware / 2, 1, 8);
}

void DecodePool::PostTo(Queue& queue, std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(queue.mu);
    if (!queue.stopping) {
      queue.tasks.push_back(std::move(task));
      queue.wake.notify_one();
      return;
    }
  }
  task();  // the threads are ending: no one else would run it
}

void DecodePool::Loop(std::shared_ptr<Queue> queue) {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lock(queue->mu);
      queue->wake.wait(lock, [&] { return queue->stopping || !queue->tasks.empty(); });
      // Stopping drains the queue first: a posted task always runs.
      if (queue->tasks.empty()) return;
      task = std::move(queue->tasks.front());
      queue->tasks.pop_front();
    }
    task();
  }
}

}  // namespace flotilla::coordinator
