// Flow control toward clients: every byte the coordinator queues for a client
// (a gRPC Generate or Chat stream's messages, an HTTP response's bytes) is
// counted, per stream and over the whole process, against bounds:
//
// - A stream whose queued bytes stay over `max_stream_bytes` for longer than
//   `stall_grace` (its client does not read) is ended: its request is
//   cancelled (the workers free its KV blocks) and the stream ends with
//   RESOURCE_EXHAUSTED (gRPC) or its connection closes (HTTP). The grace lets
//   a reading client take a burst (a worker's message of prompt logits comes
//   as up to 16 MiB at once) at its own pace.
// - While the process holds more than `max_total_bytes`, the streams that
//   would take longest to drain at the pace their clients read (measured over
//   half a second; a client that takes nothing never drains) are ended at
//   once, slowest first, until it holds less. A client that drains what it
//   holds within `stall_grace` at its pace is not ended for it, however large
//   its answer (up to --max-prompt-logits-mb of logits): a reader's burst is
//   not a stall. New and small requests are never refused for what others
//   hold.
// - A stream whose producer waits for its client (a gRPC Generate stream's
//   sequence paused at its prompt-logits credit, prompt_logits_credit.h) is
//   ended once its client has taken nothing for `stall_grace` while it
//   waited: the credit keeps it under its bound, and a paused sequence still
//   holds its KV blocks on the worker.
// - An ended stream whose client still takes nothing (not even the end) is
//   dropped `stall_grace` later, at once under global pressure (gRPC: the
//   stream is reset; HTTP: closed), so it holds nothing more.
// - While `max_open_requests` requests are open (admitted and not yet
//   delivered, streamed or whole), new requests are refused with
//   RESOURCE_EXHAUSTED (HTTP 429).
//
// Prompt logits, the only answers large enough to matter, come under credit:
// a sequence sends at most PromptLogitsWindow ahead of what its client took,
// and pauses on the worker beyond it. Other streams (tokens, text) are small
// per step: their bound is the pushback.
//
// A watchdog thread applies the grace, sheds under global pressure and gives
// freed heap back to the operating system (malloc_trim) after bursts.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace flotilla::coordinator {

struct ClientBufferOptions {
  // Bytes queued for one stream before its grace starts (--max-stream-buffer-bytes).
  size_t max_stream_bytes = size_t{4} << 20;
  // Bytes queued for all clients together (--max-client-buffer-bytes).
  size_t max_total_bytes = size_t{64} << 20;
  // How long a stream may stay over its bound (--client-stall-timeout-s).
  absl::Duration stall_grace = absl::Seconds(10);
  // The time (a fake in tests).
  std::function<absl::Time()> clock = [] { return absl::Now(); };
  // Requests admitted and not yet delivered, over both APIs (--max-inflight).
  int max_open_requests = 1024;
};

// The prompt-logits bytes one stream's sequences may send ahead of what its
// client took: half its bound, so a reading client's stream stays under it
// (a row of logits may pass the credit, and one message is being written).
inline size_t PromptLogitsWindow(const ClientBufferOptions& options) {
  return options.max_stream_bytes / 2;
}

// What a stream's owner does when the bounds end its stream. Calls come from
// the watchdog thread, never while a StreamAccount method runs.
class BufferedStream {
 public:
  virtual ~BufferedStream() = default;
  // Cancels the stream's request and ends the stream with `status`, dropping
  // what is still queued for it.
  virtual void EndStalled(const absl::Status& status) = 0;
  // The client did not take even the end: drop the stream (or connection).
  virtual void Drop() = 0;
};

class ClientBuffers;

// Makes this process's allocator map every buffer of 1 MiB or more on its own
// (a client's logits, a worker's message, an HTTP write), so that its memory
// goes back to the system as soon as it is freed: a burst does not stay in
// the heap. Smaller frees are returned by the ClientBuffers watchdog's trim.
// Call once at start, before threads run.
void ReturnLargeBuffersToSystem();

// One stream's queued bytes. Thread-safe; unregisters itself (and releases
// what it still counts) when destroyed.
class StreamAccount {
 public:
  ~StreamAccount();
  StreamAccount(const StreamAccount&) = delete;
  StreamAccount& operator=(const StreamAccount&) = delete;

  // `bytes` more are queued for the client.
  void Add(size_t bytes);
  // `bytes` were taken by the client (or dropped).
  void Remove(size_t bytes);
  // Whether the stream's producer waits for the client now (its sequence is
  // paused at its credit): see the bounds above.
  void SetProducerWaiting(bool waiting);
  size_t queued() const { return queued_.load(std::memory_order_relaxed); }

 private:
  friend class ClientBuffers;
  StreamAccount(std::shared_ptr<ClientBuffers> buffers, uint64_t id)
      : buffers_(std::move(buffers)), id_(id) {}
  std::shared_ptr<ClientBuffers> buffers_;
  const uint64_t id_;
  std::atomic<size_t> queued_{0};
};

class ClientBuffers : public std::enable_shared_from_this<ClientBuffers> {
 public:
  // Starts the watchdog unless `start_watchdog` is false (tests call Sweep).
  // Accounts and admission tokens keep the object alive.
  static std::shared_ptr<ClientBuffers> Create(ClientBufferOptions options,
                                               bool start_watchdog = true);
  ~ClientBuffers();
  ClientBuffers(const ClientBuffers&) = delete;
  ClientBuffers& operator=(const ClientBuffers&) = delete;

  const ClientBufferOptions& options() const { return options_; }

  // A new request: a token that counts it open until released (destroyed),
  // or RESOURCE_EXHAUSTED (max_open_requests open already).
  absl::StatusOr<std::shared_ptr<void>> Admit();

  // Accounts a stream whose owner is `stream` (held weakly: an owner that
  // went away is never called).
  std::unique_ptr<StreamAccount> Open(std::weak_ptr<BufferedStream> stream);

  // Bytes queued for all clients now; requests open now.
  size_t queued() const { return total_.load(std::memory_order_relaxed); }
  int open_requests() const { return open_.load(std::memory_order_relaxed); }
  // Streams ended by the bounds since start.
  uint64_t streams_ended() const { return ended_count_.load(std::memory_order_relaxed); }

  // One pass of the watchdog at `now`: ends the streams past their grace,
  // sheds under global pressure, drops ended streams whose clients still
  // take nothing.
  void Sweep(absl::Time now);

 private:
  friend class StreamAccount;
  explicit ClientBuffers(ClientBufferOptions options);
  struct Entry {
    std::weak_ptr<BufferedStream> stream;
    size_t queued = 0;
    std::optional<absl::Time> over_since;  // over max_stream_bytes since
    std::optional<absl::Time> ended_at;    // EndStalled was called then
    // The producer waits for the client, which has taken nothing since then.
    std::optional<absl::Time> waiting_since;
    bool dropped = false;
    // The client's pace: bytes taken since window_start; the pace of the
    // last whole window (bytes a second; none before one).
    size_t taken = 0;
    absl::Time window_start;
    std::optional<double> pace;
  };
  // Why the entry is to be ended now (under mu_), or nothing.
  std::optional<absl::Status> EndReasonLocked(Entry& entry, absl::Time now);
  // Why a stream whose producer waits is to be ended now, or nothing.
  std::optional<absl::Status> WaitedTooLongLocked(const Entry& entry, absl::Time now) const;
  void Changed(uint64_t id, size_t queued, size_t taken, bool was_empty);
  void SetWaiting(uint64_t id, bool waiting);
  void Close(uint64_t id, size_t queued);
  static void Watchdog(std::weak_ptr<ClientBuffers> weak);
  // Gives freed heap back to the system after large releases (or now and then).
  void MaybeTrim(absl::Time now);

  const ClientBufferOptions options_;
  std::atomic<size_t> total_{0};
  std::atomic<int> open_{0};
  std::atomic<uint64_t> ended_count_{0};
  std::atomic<size_t> released_since_trim_{0};

  std::mutex mu_;
  std::condition_variable wake_;
  std::map<uint64_t, Entry> entries_;   // under mu_
  uint64_t next_id_ = 1;                // under mu_
  bool urgent_ = false;                 // under mu_: the total passed its bound
  bool stop_ = false;                   // under mu_
  absl::Time last_trim_ = absl::Now();  // watchdog thread only
  std::thread watchdog_;
};

}  // namespace flotilla::coordinator
