// Latency and token metrics of every request the coordinator serves, whatever
// API it came through (gRPC Generate/Chat or HTTP): the cluster manager wraps
// each request's callbacks, and /metrics renders them in Prometheus text.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace flotilla::coordinator {

// A Prometheus histogram (cumulative buckets, sum, count). Thread-safe.
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void Observe(double v);
  void Render(const std::string& name, const std::string& help, std::string& out) const;

 private:
  mutable std::mutex mu_;
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;
  double sum_ = 0;
  uint64_t count_ = 0;
};

struct ServingMetrics {
  ServingMetrics();
  Histogram ttft;  // admission to the first generated token
  Histogram itl;   // between generated tokens of one request
  Histogram e2e;   // admission to the last token
  std::atomic<uint64_t> prompt_tokens{0};
  std::atomic<uint64_t> generation_tokens{0};

  // Appends the five series.
  void Render(std::string& out) const;
};

}  // namespace flotilla::coordinator
