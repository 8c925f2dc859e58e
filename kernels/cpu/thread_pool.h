// A small fixed-size thread pool for the CPU kernels. It is an object the
// caller creates and passes in (no global pool); kernels accept nullptr and
// then run on the calling thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace flotilla::kernels::cpu {

class ThreadPool {
 public:
  // `num_threads` <= 0 means one per hardware thread. The calling thread is one
  // of them: a pool of N threads starts N - 1 workers.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return num_threads_; }

  // Calls fn(begin, end) on contiguous ranges covering [0, n), each at least
  // `min_chunk` long (except the last), in parallel; returns when all are done.
  // Calls must not be nested or made concurrently from several threads.
  void ParallelFor(int64_t n, const std::function<void(int64_t, int64_t)>& fn,
                   int64_t min_chunk = 1);

 private:
  void WorkerLoop(int index);

  int num_threads_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable start_cv_;
  std::condition_variable done_cv_;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
  int64_t n_ = 0;
  int64_t chunk_ = 0;
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
};

// Runs fn over [0, n) on `pool`, or serially when pool is nullptr.
inline void ParallelFor(ThreadPool* pool, int64_t n,
                        const std::function<void(int64_t, int64_t)>& fn, int64_t min_chunk = 1) {
  if (n <= 0) return;
  if (pool == nullptr) {
    fn(0, n);
  } else {
    pool->ParallelFor(n, fn, min_chunk);
  }
}

}  // namespace flotilla::kernels::cpu
