#include "worker/control_session.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/cluster_token.h"
#include "worker/worker_messages.h"

namespace flotilla::worker {

ControlSession::ControlSession(const WorkerOptions& options) : options_(options) {}

ControlSession::~ControlSession() {
  Close();
  if (writer_.joinable() || reader_.joinable() || heartbeat_.joinable()) (void)Finish();
}

absl::Status ControlSession::Connect() {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(256 << 20);
  args.SetMaxSendMessageSize(256 << 20);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 1000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 2000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // Each session has a channel of its own, retried briskly: a coordinator
  // coming back is found within a second, not after gRPC's default backoff
  // (up to minutes) that a shared subchannel would carry over.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      MakeChannelCredentials(options_.tls);
  if (!credentials.ok()) return credentials.status();
  channel_ = grpc::CreateCustomChannel(options_.coordinator, *credentials, args);
  // In slices, so that Close (a signal) ends the wait.
  const absl::Time deadline = absl::Now() + options_.connect_timeout;
  while (!closing_) {
    const absl::Time slice = std::min(deadline, absl::Now() + absl::Milliseconds(200));
    if (channel_->WaitForConnected(absl::ToChronoTime(slice))) return absl::OkStatus();
    if (absl::Now() >= deadline) break;
  }
  return absl::UnavailableError(
      absl::StrCat("cannot reach the coordinator at ", options_.coordinator));
}

absl::Status ControlSession::Open(cluster::WorkerMessage hello, LoadReporter report,
                                  UrgentHandler urgent) {
  if (!channel_) return absl::FailedPreconditionError("Open before Connect");
  report_ = std::move(report);
  urgent_ = std::move(urgent);
  stub_ = cluster::ClusterControl::NewStub(channel_);
  if (!options_.cluster_token.empty()) {
    context_.AddMetadata(kClusterTokenMetadataKey, options_.cluster_token);
  }
  stream_ = stub_->Session(&context_);
  writer_ = std::thread([this] { WriterLoop(); });
  Send(std::move(hello));
  reader_ = std::thread([this] { ReaderLoop(); });
  heartbeat_ = std::thread([this] { HeartbeatLoop(); });
  return absl::OkStatus();
}

void ControlSession::Send(cluster::WorkerMessage message) {
  {
    std::lock_guard<std::mutex> lock(outbox_mu_);
    outbox_.push_back(std::move(message));
  }
  outbox_cv_.notify_one();
}

// The step loop never waits on the coordinator's stream: messages queue and
// this thread writes them in order (in parts of kSessionPartBytes).
void ControlSession::WriterLoop() {
  std::unique_lock<std::mutex> lock(outbox_mu_);
  while (true) {
    outbox_cv_.wait(lock, [this] { return writer_done_ || !outbox_.empty(); });
    if (outbox_.empty()) return;  // done and drained
    std::deque<cluster::WorkerMessage> batch;
    batch.swap(outbox_);
    lock.unlock();
    for (const cluster::WorkerMessage& m : batch) {
      ForEachWorkerMessagePart(m, kSessionPartBytes,
                               [this](const cluster::WorkerMessage& part) { stream_->Write(part); });
    }
    lock.lock();
  }
}

void ControlSession::ReaderLoop() {
  cluster::CoordinatorMessage m;
  while (stream_->Read(&m)) {
    if (m.kind_case() == cluster::CoordinatorMessage::kWelcome) {
      heartbeat_ms_ = std::max<uint32_t>(10, m.welcome().heartbeat_interval_ms());
      continue;
    }
    if (urgent_ && m.kind_case() == cluster::CoordinatorMessage::kDropGeneration) urgent_(m);
    std::lock_guard<std::mutex> lock(mu_);
    inbox_.push_back(m);
    cv_.notify_all();
  }
  const bool asked_to_stop = closing_.load();
  if (urgent_) {
    cluster::CoordinatorMessage ended;
    ended.mutable_drop_generation()->set_reason("the session with the coordinator ended");
    urgent_(ended);
  }
  grpc::Status st = stream_->Finish();
  if (asked_to_stop) st = grpc::Status::OK;
  {
    std::lock_guard<std::mutex> lock(mu_);
    end_status_ =
        st.ok() ? absl::OkStatus()
                : absl::Status(static_cast<absl::StatusCode>(st.error_code()),
                               absl::StrCat("coordinator ended the session: ", st.error_message()));
    ended_ = true;
  }
  cv_.notify_all();
}

void ControlSession::ReportLoadNow() {
  std::lock_guard<std::mutex> lock(heartbeat_mu_);
  cluster::WorkerMessage m;
  cluster::Heartbeat* hb = m.mutable_heartbeat();
  hb->set_unix_ms(static_cast<uint64_t>(absl::ToUnixMillis(absl::Now())));
  if (report_) report_(hb->mutable_load());
  Send(std::move(m));
}

void ControlSession::HeartbeatLoop() {
  while (!ended_) {
    ReportLoadNow();
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, std::chrono::milliseconds(heartbeat_ms_.load()),
                 [this] { return ended_.load(); });
  }
}

std::vector<cluster::CoordinatorMessage> ControlSession::Receive(absl::Duration wait) {
  std::unique_lock<std::mutex> lock(mu_);
  if (wait > absl::ZeroDuration()) {
    cv_.wait_for(lock, absl::ToChronoMilliseconds(wait),
                 [this] { return ended_.load() || !inbox_.empty(); });
  }
  std::vector<cluster::CoordinatorMessage> got(std::make_move_iterator(inbox_.begin()),
                                               std::make_move_iterator(inbox_.end()));
  inbox_.clear();
  return got;
}

void ControlSession::Close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    closing_ = true;
    ended_ = true;
  }
  cv_.notify_all();
  context_.TryCancel();
}

absl::Status ControlSession::Finish() {
  if (heartbeat_.joinable()) heartbeat_.join();
  {
    std::lock_guard<std::mutex> lock(outbox_mu_);
    writer_done_ = true;
  }
  outbox_cv_.notify_one();
  if (writer_.joinable()) writer_.join();
  if (reader_.joinable()) reader_.join();
  std::lock_guard<std::mutex> lock(mu_);
  return end_status_;
}

}  // namespace flotilla::worker
