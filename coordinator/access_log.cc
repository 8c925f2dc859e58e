#include "coordinator/access_log.h"

#include <atomic>
#include <vector>

#include "absl/time/clock.h"
#include "common/logging.h"
#include "coordinator/serving_metrics.h"

namespace flotilla::coordinator {

const char* FailedFinishReason(const absl::Status& status) {
  return FinishedReasonName(FailedReason(status));
}

void RecordEvents(AccessRecord& access, const std::vector<RequestEvent>& events) {
  for (const RequestEvent& e : events) {
    switch (e.kind) {
      case RequestEvent::Kind::kTokens:
        access.AddOutputTokens(static_cast<uint32_t>(e.update->token_ids_size()), absl::Now());
        break;
      case RequestEvent::Kind::kFinish:
        access.set_finish_reason(e.finish_reason);
        break;
      case RequestEvent::Kind::kUsage:
        access.set_output_tokens(e.usage.completion_tokens);
        break;
      case RequestEvent::Kind::kError:
        access.set_finish_reason(FailedFinishReason(e.status));
        break;
      default:
        break;
    }
  }
}

AccessRecord::AccessRecord(std::string api, absl::Time start)
    : api_(std::move(api)), start_(start) {}

void AccessRecord::set_api(std::string api) {
  std::lock_guard<std::mutex> l(mu_);
  api_ = std::move(api);
}
void AccessRecord::set_request_id(std::string id) {
  std::lock_guard<std::mutex> l(mu_);
  request_id_ = std::move(id);
}
void AccessRecord::set_key(std::string key) {
  std::lock_guard<std::mutex> l(mu_);
  key_ = std::move(key);
}
void AccessRecord::set_prompt_tokens(uint32_t n) {
  std::lock_guard<std::mutex> l(mu_);
  prompt_tokens_ = n;
}
void AccessRecord::AddOutputTokens(uint32_t n, absl::Time now) {
  if (n == 0) return;
  std::lock_guard<std::mutex> l(mu_);
  if (!ttft_) ttft_ = now - start_;
  output_tokens_ += n;
}
void AccessRecord::set_output_tokens(uint32_t n) {
  std::lock_guard<std::mutex> l(mu_);
  output_tokens_ = n;
}
void AccessRecord::set_finish_reason(std::string reason) {
  std::lock_guard<std::mutex> l(mu_);
  finish_reason_ = std::move(reason);
}
void AccessRecord::set_level(spdlog::level::level_enum level) {
  std::lock_guard<std::mutex> l(mu_);
  level_ = level;
}

std::optional<absl::Duration> AccessRecord::ttft() const {
  std::lock_guard<std::mutex> l(mu_);
  return ttft_;
}
uint32_t AccessRecord::output_tokens() const {
  std::lock_guard<std::mutex> l(mu_);
  return output_tokens_;
}

namespace {
std::atomic<bool> log_ids{false};
}  // namespace

void SetAccessLogIds(bool on) { log_ids.store(on, std::memory_order_relaxed); }

void AccessRecord::Log(std::string_view status, absl::Time end) {
  const bool with_id = log_ids.load(std::memory_order_relaxed);
  std::vector<LogField> fields;
  spdlog::level::level_enum level;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (logged_) return;
    logged_ = true;
    level = level_;
    fields = {
        request_id_.empty() || !with_id ? LogField::Null("request_id")
                                        : LogField("request_id", request_id_),
        key_.empty() ? LogField::Null("key") : LogField("key", key_),
        LogField("api", api_),
        LogField("status", status),
        LogField("prompt_tokens", prompt_tokens_),
        LogField("output_tokens", output_tokens_),
        ttft_ ? LogField("ttft_ms", absl::ToDoubleMilliseconds(*ttft_)) : LogField::Null("ttft_ms"),
        LogField("duration_ms", absl::ToDoubleMilliseconds(end - start_)),
        finish_reason_.empty() ? LogField::Null("finish_reason")
                               : LogField("finish_reason", finish_reason_),
    };
  }
  LogEvent(level, "access", fields);
}

}  // namespace flotilla::coordinator
