#include "coordinator/client_buffers.h"

#include <malloc.h>

#include <algorithm>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "spdlog/spdlog.h"

namespace flotilla::coordinator {
namespace {

// Freed client buffers that make the watchdog return heap to the system at
// once; after smaller releases it does so every kTrimInterval.
constexpr size_t kTrimAfterReleasedBytes = size_t{16} << 20;
constexpr absl::Duration kTrimInterval = absl::Seconds(5);
// Allocations this large are mapped on their own (ReturnLargeBuffersToSystem).
constexpr int kMmapThresholdBytes = 1 << 20;
// A client's pace is measured over windows this long.
constexpr absl::Duration kPaceWindow = absl::Milliseconds(500);

// "512 KiB", "3.5 MiB": bytes as messages name them.
std::string Bytes(size_t bytes) {
  if (bytes < 1024) return absl::StrCat(bytes, " bytes");
  if (bytes < (size_t{1} << 20)) return absl::StrCat(bytes >> 10, " KiB");
  return absl::StrCat(static_cast<double>((bytes * 10) >> 20) / 10, " MiB");
}

// Holds one open request; the count drops when the last copy goes.
struct OpenRequest {
  explicit OpenRequest(std::shared_ptr<ClientBuffers> b, std::atomic<int>* n)
      : buffers(std::move(b)), open(n) {}
  ~OpenRequest() { open->fetch_sub(1, std::memory_order_relaxed); }
  std::shared_ptr<ClientBuffers> buffers;  // keeps `open` alive
  std::atomic<int>* open;
};

}  // namespace

void ReturnLargeBuffersToSystem() {
  // A fixed threshold also stops glibc from raising it after each large free
  // (its default), which is what keeps a burst's buffers in the heap.
  mallopt(M_MMAP_THRESHOLD, kMmapThresholdBytes);
}

StreamAccount::~StreamAccount() { buffers_->Close(id_, queued_.exchange(0)); }

void StreamAccount::Add(size_t bytes) {
  const size_t before = queued_.fetch_add(bytes, std::memory_order_relaxed);
  buffers_->total_.fetch_add(bytes, std::memory_order_relaxed);
  buffers_->Changed(id_, before + bytes, 0, /*was_empty=*/before == 0);
}

void StreamAccount::Remove(size_t bytes) {
  const size_t now = queued_.fetch_sub(bytes, std::memory_order_relaxed) - bytes;
  buffers_->total_.fetch_sub(bytes, std::memory_order_relaxed);
  buffers_->released_since_trim_.fetch_add(bytes, std::memory_order_relaxed);
  buffers_->Changed(id_, now, bytes, false);
}

void StreamAccount::SetProducerWaiting(bool waiting) { buffers_->SetWaiting(id_, waiting); }

std::shared_ptr<ClientBuffers> ClientBuffers::Create(ClientBufferOptions options,
                                                     bool start_watchdog) {
  std::shared_ptr<ClientBuffers> buffers(new ClientBuffers(std::move(options)));
  if (start_watchdog) {
    buffers->watchdog_ =
        std::thread(&ClientBuffers::Watchdog, std::weak_ptr<ClientBuffers>(buffers));
  }
  return buffers;
}

ClientBuffers::ClientBuffers(ClientBufferOptions options) : options_(std::move(options)) {}

ClientBuffers::~ClientBuffers() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  if (!watchdog_.joinable()) return;
  // The last reference may be dropped by the watchdog itself (a stream it ended).
  if (watchdog_.get_id() == std::this_thread::get_id()) {
    watchdog_.detach();
  } else {
    watchdog_.join();
  }
}

absl::StatusOr<std::shared_ptr<void>> ClientBuffers::Admit() {
  if (open_.fetch_add(1, std::memory_order_relaxed) >= options_.max_open_requests) {
    open_.fetch_sub(1, std::memory_order_relaxed);
    return absl::ResourceExhaustedError(absl::StrCat("the server is answering ",
                                                     options_.max_open_requests,
                                                     " requests (--max-inflight); retry shortly"));
  }
  return std::shared_ptr<void>(std::make_shared<OpenRequest>(shared_from_this(), &open_));
}

std::unique_ptr<StreamAccount> ClientBuffers::Open(std::weak_ptr<BufferedStream> stream) {
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t id = next_id_++;
  Entry& e = entries_[id];
  e.stream = std::move(stream);
  e.window_start = options_.clock();
  return std::unique_ptr<StreamAccount>(new StreamAccount(shared_from_this(), id));
}

void ClientBuffers::Changed(uint64_t id, size_t queued, size_t taken, bool was_empty) {
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(id);
    if (it == entries_.end()) return;
    Entry& e = it->second;
    e.queued = queued;
    e.taken += taken;
    if (taken > 0 && e.waiting_since) e.waiting_since = options_.clock();
    if (was_empty) {
      // A pace is measured while something waits: a burst after a quiet
      // time gets a whole window to show how fast its client takes it.
      e.taken = 0;
      e.window_start = options_.clock();
      e.pace.reset();
    }
    if (taken == 0 && total_.load(std::memory_order_relaxed) > options_.max_total_bytes &&
        !urgent_) {
      wake = urgent_ = true;
    }
  }
  if (wake) wake_.notify_all();
}

void ClientBuffers::SetWaiting(uint64_t id, bool waiting) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(id);
  if (it == entries_.end()) return;
  Entry& e = it->second;
  if (!waiting) {
    e.waiting_since.reset();
  } else if (!e.waiting_since) {
    e.waiting_since = options_.clock();
  }
}

void ClientBuffers::Close(uint64_t id, size_t queued) {
  if (queued > 0) {
    total_.fetch_sub(queued, std::memory_order_relaxed);
    released_since_trim_.fetch_add(queued, std::memory_order_relaxed);
  }
  std::lock_guard<std::mutex> lock(mu_);
  entries_.erase(id);
}

std::optional<absl::Status> ClientBuffers::WaitedTooLongLocked(const Entry& e,
                                                               absl::Time now) const {
  if (!e.waiting_since || e.queued == 0) return std::nullopt;
  const absl::Duration waited = now - *e.waiting_since;
  if (waited < options_.stall_grace) return std::nullopt;
  return absl::ResourceExhaustedError(absl::StrCat(
      "the client does not read its stream: its sequence waited for it (paused at its "
      "prompt-logits credit, ",
      Bytes(PromptLogitsWindow(options_)), " a stream ahead of the client) and it took none of ",
      Bytes(e.queued), " for ", absl::FormatDuration(absl::Trunc(waited, absl::Milliseconds(1))),
      " (longer than --client-stall-timeout-s); the request was cancelled"));
}

std::optional<absl::Status> ClientBuffers::EndReasonLocked(Entry& e, absl::Time now) {
  if (std::optional<absl::Status> why = WaitedTooLongLocked(e, now)) return why;
  const size_t bound = options_.max_stream_bytes;
  if (e.queued <= bound) {
    e.over_since.reset();
    return std::nullopt;
  }
  if (!e.over_since) e.over_since = now;
  if (now - *e.over_since < options_.stall_grace) return std::nullopt;
  return absl::ResourceExhaustedError(
      absl::StrCat("the client does not read its stream: ", Bytes(e.queued), " waited for it for ",
                   absl::FormatDuration(absl::Trunc(now - *e.over_since, absl::Milliseconds(1))),
                   " (over --max-stream-buffer-bytes, ", Bytes(bound),
                   ", for longer than --client-stall-timeout-s); the request was cancelled"));
}

void ClientBuffers::Sweep(absl::Time now) {
  std::vector<std::pair<std::shared_ptr<BufferedStream>, absl::Status>> end;
  std::vector<std::shared_ptr<BufferedStream>> drop;
  {
    std::lock_guard<std::mutex> lock(mu_);
    urgent_ = false;
    size_t remaining = total_.load(std::memory_order_relaxed);
    const bool pressed = remaining > options_.max_total_bytes;
    // (seconds to drain, bytes, id): the slowest, then the largest, first.
    std::vector<std::tuple<double, size_t, uint64_t>> sheddable;
    for (auto& [id, e] : entries_) {
      if (now - e.window_start >= kPaceWindow) {
        e.pace = static_cast<double>(e.taken) / absl::ToDoubleSeconds(now - e.window_start);
        e.taken = 0;
        e.window_start = now;
      }
      if (e.ended_at) {
        remaining -= std::min(remaining, e.queued);  // going already
        if (e.dropped) continue;
        // Ended, and the client has not taken even that: drop it (at once
        // under global pressure).
        if (e.queued > 0 && (pressed || now - *e.ended_at >= options_.stall_grace)) {
          e.dropped = true;
          if (auto s = e.stream.lock()) drop.push_back(std::move(s));
        }
        continue;
      }
      std::optional<absl::Status> why = EndReasonLocked(e, now);
      if (!why) {
        // Under pressure, a stream whose client would not drain it within
        // the grace at its pace may be shed.
        if (e.queued > 0 && e.pace) {
          const double drain = *e.pace > 0 ? static_cast<double>(e.queued) / *e.pace : 1e300;
          if (drain > absl::ToDoubleSeconds(options_.stall_grace)) {
            sheddable.emplace_back(drain, e.queued, id);
          }
        }
        continue;
      }
      e.ended_at = now;
      remaining -= std::min(remaining, e.queued);
      if (auto s = e.stream.lock()) end.emplace_back(std::move(s), *std::move(why));
    }
    // Over the global bound: end the slowest to drain until under it.
    std::sort(sheddable.rbegin(), sheddable.rend());
    for (const auto& [drain, bytes, id] : sheddable) {
      if (remaining <= options_.max_total_bytes) break;
      Entry& e = entries_[id];
      const size_t queued = e.queued;
      e.ended_at = now;
      remaining -= std::min(remaining, queued);
      if (auto s = e.stream.lock()) {
        end.emplace_back(std::move(s),
                         absl::ResourceExhaustedError(absl::StrCat(
                             "the server holds over ", Bytes(options_.max_total_bytes),
                             " for clients that do not read (--max-client-buffer-bytes); this "
                             "stream held ",
                             Bytes(queued),
                             ", its client taking it among the slowest; the request "
                             "was cancelled")));
      }
    }
  }
  for (auto& [stream, status] : end) {
    spdlog::warn("{}", std::string(status.message()));
    ended_count_.fetch_add(1, std::memory_order_relaxed);
    stream->EndStalled(status);
  }
  for (auto& stream : drop) stream->Drop();
}

void ClientBuffers::MaybeTrim(absl::Time now) {
  const size_t released = released_since_trim_.load(std::memory_order_relaxed);
  if (released == 0) return;  // idle: nothing new to give back
  if (released < kTrimAfterReleasedBytes && now - last_trim_ < kTrimInterval) return;
  // Only once the bursts are over: trimming while buffers are full frees little.
  if (queued() > options_.max_total_bytes / 2) return;
  released_since_trim_.store(0, std::memory_order_relaxed);
  last_trim_ = now;
  malloc_trim(0);
}

void ClientBuffers::Watchdog(std::weak_ptr<ClientBuffers> weak) {
  while (true) {
    // Held for one round only: the last reference may go in it (a stream it
    // ended), and then the destructor runs here.
    std::shared_ptr<ClientBuffers> self = weak.lock();
    if (!self) return;
    const absl::Duration period =
        std::clamp(self->options_.stall_grace / 4, absl::Milliseconds(20), kPaceWindow);
    {
      std::unique_lock<std::mutex> lock(self->mu_);
      self->wake_.wait_for(lock, absl::ToChronoNanoseconds(period),
                           [&] { return self->stop_ || self->urgent_; });
      if (self->stop_) return;
    }
    const absl::Time now = self->options_.clock();
    self->Sweep(now);
    self->MaybeTrim(now);
  }
}

}  // namespace flotilla::coordinator
