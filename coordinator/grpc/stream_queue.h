// Outgoing message queue for a gRPC callback-API server stream (bidi or
// server-streaming reactor): any thread may Send or Close; writes are issued
// one at a time, and Finish happens after the queued writes drain. Shared
// between the reactor (which gRPC deletes in OnDone) and whoever sends, so it
// outlives the reactor safely.
//
// With a StreamAccount (client streams), the queued messages' bytes are
// counted against the flow-control bounds (client_buffers.h), whose watchdog
// ends a stream its client does not read (Abort, then Cancel if the client
// takes nothing at all).
//
// A message may come with a function called once gRPC has taken it (its
// write completed; prompt-logits credit is granted from there).
#pragma once

#include <grpcpp/grpcpp.h>

#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <utility>

#include "coordinator/client_buffers.h"

namespace flotilla::coordinator {

template <typename Reactor, typename Message>
class StreamQueue {
 public:
  explicit StreamQueue(Reactor* reactor, grpc::CallbackServerContext* context = nullptr)
      : reactor_(reactor), context_(context) {}

  // Counts what is queued from now on in `account` (before the first Send).
  void SetAccount(std::unique_ptr<StreamAccount> account) {
    std::lock_guard<std::mutex> lock(mu_);
    account_ = std::move(account);
  }

  // Queues `m`; dropped once the stream is closing or gone, or over its
  // bound. `written`, if any, is called (without the queue's lock) once the
  // message's write completed, never if it was dropped.
  void Send(const Message& m) { Send(Message(m)); }
  void Send(Message&& m, std::function<void()> written = nullptr) {
    std::lock_guard<std::mutex> lock(mu_);
    if (reactor_ == nullptr || closing_) return;
    const size_t bytes = account_ ? m.ByteSizeLong() : 0;
    if (account_) account_->Add(bytes);
    queue_.push_back(Queued{std::move(m), bytes, std::move(written)});
    if (!writing_) {
      writing_ = true;
      reactor_->StartWrite(&queue_.front().message);
    }
  }

  // Whether Send would queue anything now: false once the stream is closing
  // or gone (so a large message need not even be built).
  bool accepting() const {
    std::lock_guard<std::mutex> lock(mu_);
    return reactor_ != nullptr && !closing_;
  }

  // Finishes the stream with `status` once queued writes are done.
  void Close(const grpc::Status& status) {
    std::lock_guard<std::mutex> lock(mu_);
    if (reactor_ == nullptr || closing_) return;
    closing_ = true;
    status_ = status;
    if (!writing_) FinishLocked();
  }

  // Finishes the stream with `status` now: what is queued and not yet being
  // written is dropped.
  void Abort(const grpc::Status& status) {
    std::lock_guard<std::mutex> lock(mu_);
    if (reactor_ == nullptr || finished_) return;
    while (queue_.size() > (writing_ ? 1u : 0u)) {
      if (account_) account_->Remove(queue_.back().bytes);
      queue_.pop_back();
    }
    closing_ = true;
    status_ = status;
    FinishLocked();
  }

  // Tells the bounds whether the stream's producer waits for the client
  // (StreamAccount::SetProducerWaiting).
  void SetProducerWaiting(bool waiting) {
    std::lock_guard<std::mutex> lock(mu_);
    if (account_) account_->SetProducerWaiting(waiting);
  }

  // Resets the stream (the client took nothing, not even its end).
  void Cancel() {
    std::lock_guard<std::mutex> lock(mu_);
    if (reactor_ != nullptr && context_ != nullptr) context_->TryCancel();
  }

  // From the reactor's OnWriteDone.
  void WriteDone(bool ok) {
    std::function<void()> written;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (reactor_ == nullptr) return;
      if (ok) written = std::move(queue_.front().written);
      WriteDoneLocked(ok);
    }
    if (written) written();
  }

  // From the reactor's OnDone: the reactor is about to be deleted.
  void Detach() {
    std::lock_guard<std::mutex> lock(mu_);
    reactor_ = nullptr;
    context_ = nullptr;
    queue_.clear();
    account_.reset();
  }

  bool closing() const {
    std::lock_guard<std::mutex> lock(mu_);
    return closing_;
  }

 private:
  struct Queued {
    Message message;
    size_t bytes;                   // counted in account_
    std::function<void()> written;  // called once its write completed
  };
  void WriteDoneLocked(bool ok) {
    if (account_) account_->Remove(queue_.front().bytes);
    queue_.pop_front();
    if (!ok) {
      while (!queue_.empty()) {
        if (account_) account_->Remove(queue_.front().bytes);
        queue_.pop_front();
      }
      writing_ = false;
      if (!closing_) {
        closing_ = true;
        status_ = grpc::Status(grpc::StatusCode::UNAVAILABLE, "write failed: peer gone");
      }
      FinishLocked();
      return;
    }
    if (!queue_.empty()) {
      reactor_->StartWrite(&queue_.front().message);
    } else {
      writing_ = false;
      if (closing_) FinishLocked();
    }
  }
  void FinishLocked() {
    if (finished_) return;
    finished_ = true;
    reactor_->Finish(status_);
  }

  mutable std::mutex mu_;
  Reactor* reactor_;
  grpc::CallbackServerContext* context_;  // null: Cancel does nothing
  std::deque<Queued> queue_;
  std::unique_ptr<StreamAccount> account_;
  bool writing_ = false;
  bool closing_ = false;
  bool finished_ = false;
  grpc::Status status_;
};

}  // namespace flotilla::coordinator
