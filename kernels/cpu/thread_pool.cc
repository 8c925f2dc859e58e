#include "kernels/cpu/thread_pool.h"

#include <algorithm>

namespace flotilla::kernels::cpu {

ThreadPool::ThreadPool(int num_threads) {
  if (num_threads <= 0) num_threads = static_cast<int>(std::thread::hardware_concurrency());
  num_threads_ = std::max(1, num_threads);
  workers_.reserve(num_threads_ - 1);
  for (int i = 1; i < num_threads_; ++i) workers_.emplace_back([this, i] { WorkerLoop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  start_cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::WorkerLoop(int index) {
  uint64_t seen = 0;
  while (true) {
    int64_t begin, end;
    const std::function<void(int64_t, int64_t)>* fn;
    {
      std::unique_lock<std::mutex> lock(mu_);
      start_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      begin = std::min(n_, index * chunk_);
      end = std::min(n_, begin + chunk_);
      fn = fn_;
    }
    if (begin < end) (*fn)(begin, end);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (--pending_ == 0) done_cv_.notify_one();
    }
  }
}

void ThreadPool::ParallelFor(int64_t n, const std::function<void(int64_t, int64_t)>& fn,
                             int64_t min_chunk) {
  if (n <= 0) return;
  min_chunk = std::max<int64_t>(1, min_chunk);
  int64_t parts = std::min<int64_t>(num_threads_, (n + min_chunk - 1) / min_chunk);
  if (parts <= 1 || workers_.empty()) {
    fn(0, n);
    return;
  }
  int64_t chunk = (n + num_threads_ - 1) / num_threads_;
  chunk = std::max(chunk, min_chunk);
  {
    std::lock_guard<std::mutex> lock(mu_);
    n_ = n;
    chunk_ = chunk;
    fn_ = &fn;
    pending_ = static_cast<int>(workers_.size());
    ++generation_;
  }
  start_cv_.notify_all();
  fn(0, std::min(n, chunk));
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return pending_ == 0; });
  fn_ = nullptr;
}

}  // namespace flotilla::kernels::cpu
