// A CoordinatorClient for tests: the test pushes the coordinator's messages
// and waits for what the worker sent; no gRPC.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <vector>

#include "worker/coordinator_client.h"

namespace flotilla::worker {

class FakeCoordinatorClient final : public CoordinatorClient {
 public:
  absl::Status Connect() override { return connect_status; }
  absl::Status Open(cluster::WorkerMessage hello, LoadReporter report,
                    UrgentHandler urgent) override {
    std::lock_guard<std::mutex> lock(mu_);
    hello_ = std::move(hello);
    report_ = std::move(report);
    urgent_ = std::move(urgent);
    opened_ = true;
    cv_.notify_all();
    return absl::OkStatus();
  }
  void Send(cluster::WorkerMessage message) override {
    std::lock_guard<std::mutex> lock(mu_);
    sent_.push_back(std::move(message));
    cv_.notify_all();
  }
  // A heartbeat with the load now, recorded with what Send queued (the fake
  // sends no periodic ones).
  void ReportLoadNow() override {
    cluster::WorkerMessage m;
    *m.mutable_heartbeat()->mutable_load() = Load();
    Send(std::move(m));
  }
  std::vector<cluster::CoordinatorMessage> Receive(absl::Duration wait) override {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, absl::ToChronoMilliseconds(wait),
                 [this] { return ended_ || !inbox_.empty(); });
    std::vector<cluster::CoordinatorMessage> got(inbox_.begin(), inbox_.end());
    inbox_.clear();
    return got;
  }
  bool Ended() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return ended_;
  }
  void Close() override {
    std::lock_guard<std::mutex> lock(mu_);
    ended_ = true;
    cv_.notify_all();
  }
  absl::Status Finish() override {
    std::lock_guard<std::mutex> lock(mu_);
    return finish_status_;
  }

  // What Connect answers.
  absl::Status connect_status;

  // The coordinator ends the session with `why` (what Finish then returns).
  void EndSession(absl::Status why) {
    UrgentHandler urgent;
    {
      std::lock_guard<std::mutex> lock(mu_);
      urgent = urgent_;
    }
    if (urgent) {  // as ControlSession's reader does
      cluster::CoordinatorMessage ended;
      ended.mutable_drop_generation()->set_reason("the session ended");
      urgent(ended);
    }
    std::lock_guard<std::mutex> lock(mu_);
    finish_status_ = std::move(why);
    ended_ = true;
    cv_.notify_all();
  }
  // Waits (up to 10 s) until the worker opened the session.
  bool WaitOpened() {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(10), [&] { return opened_; });
  }

  // A message from the coordinator.
  void Push(cluster::CoordinatorMessage message) {
    UrgentHandler urgent;
    {
      std::lock_guard<std::mutex> lock(mu_);
      urgent = urgent_;
    }
    // As ControlSession's reader does: urgent messages are seen at once.
    if (urgent && message.has_drop_generation()) urgent(message);
    std::lock_guard<std::mutex> lock(mu_);
    inbox_.push_back(std::move(message));
    cv_.notify_all();
  }
  // Waits (up to 10 s) until `done` holds for what the worker sent so far.
  bool WaitFor(const std::function<bool(const std::vector<cluster::WorkerMessage>&)>& done) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(10), [&] { return done(sent_); });
  }
  std::vector<cluster::WorkerMessage> sent() const {
    std::lock_guard<std::mutex> lock(mu_);
    return sent_;
  }
  cluster::WorkerMessage hello() const {
    std::lock_guard<std::mutex> lock(mu_);
    return hello_;
  }
  // The load a heartbeat would carry now.
  cluster::WorkerLoad Load() const {
    LoadReporter report;
    {
      std::lock_guard<std::mutex> lock(mu_);
      report = report_;
    }
    cluster::WorkerLoad load;
    if (report) report(&load);
    return load;
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<cluster::CoordinatorMessage> inbox_;
  std::vector<cluster::WorkerMessage> sent_;
  cluster::WorkerMessage hello_;
  LoadReporter report_;
  UrgentHandler urgent_;
  absl::Status finish_status_;
  bool opened_ = false;
  bool ended_ = false;
};

}  // namespace flotilla::worker
