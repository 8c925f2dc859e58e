// Outgoing message queue for a gRPC callback-API server stream (bidi or
// server-streaming reactor): any thread may Send or Close; writes are issued
// one at a time, and Finish happens after the queued writes drain. Shared
// between the reactor (which gRPC deletes in OnDone) and whoever sends, so it
// outlives the reactor safely.
#pragma once

#include <grpcpp/grpcpp.h>

#include <deque>
#include <mutex>

namespace flotilla::coordinator {

template <typename Reactor, typename Message>
class StreamQueue {
 public:
  explicit StreamQueue(Reactor* reactor) : reactor_(reactor) {}

  // Queues `m`; dropped once the stream is closing or gone.
  void Send(const Message& m) {
    std::lock_guard<std::mutex> lock(mu_);
    if (reactor_ == nullptr || closing_) return;
    queue_.push_back(m);
    if (!writing_) {
      writing_ = true;
      reactor_->StartWrite(&queue_.front());
    }
  }

  // Finishes the stream with `status` once queued writes are done.
  void Close(const grpc::Status& status) {
    std::lock_guard<std::mutex> lock(mu_);
    if (reactor_ == nullptr || closing_) return;
    closing_ = true;
    status_ = status;
    if (!writing_) reactor_->Finish(status_);
  }

  // From the reactor's OnWriteDone.
  void WriteDone(bool ok) {
    std::lock_guard<std::mutex> lock(mu_);
    if (reactor_ == nullptr) return;
    queue_.pop_front();
    if (!ok) {
      queue_.clear();
      writing_ = false;
      if (!closing_) {
        closing_ = true;
        status_ = grpc::Status(grpc::StatusCode::UNAVAILABLE, "write failed: peer gone");
      }
      reactor_->Finish(status_);
      return;
    }
    if (!queue_.empty()) {
      reactor_->StartWrite(&queue_.front());
    } else {
      writing_ = false;
      if (closing_) reactor_->Finish(status_);
    }
  }

  // From the reactor's OnDone: the reactor is about to be deleted.
  void Detach() {
    std::lock_guard<std::mutex> lock(mu_);
    reactor_ = nullptr;
    queue_.clear();
  }

  bool closing() const {
    std::lock_guard<std::mutex> lock(mu_);
    return closing_;
  }

 private:
  mutable std::mutex mu_;
  Reactor* reactor_;
  std::deque<Message> queue_;
  bool writing_ = false;
  bool closing_ = false;
  grpc::Status status_;
};

}  // namespace flotilla::coordinator
