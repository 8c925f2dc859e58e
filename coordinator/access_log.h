// The access log: one line per request the coordinator answers, whatever API
// it came through, for operators (request id, key id, API, status, prompt and
// output tokens, time to first token, duration, finish reason). Each layer
// fills in what it knows; the line is written once, when the request ends.
// Request ids (a stored response's id continues its conversation) are left
// out unless the operator asks for them (--access-log-ids).
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "coordinator/request_events.h"
#include "spdlog/common.h"

namespace flotilla::coordinator {

// Whether access lines carry request ids (default false). Part of the
// process's logging setup, like the log level: set once at start.
void SetAccessLogIds(bool on);

class AccessRecord {
 public:
  // `api` names the call: "POST /v1/chat/completions", "grpc Generate", ...
  AccessRecord(std::string api, absl::Time start);

  void set_api(std::string api);
  void set_request_id(std::string id);
  void set_key(std::string key);  // the caller's key id ("client:0"), never the key
  void set_prompt_tokens(uint32_t n);
  // Output tokens as they arrive; the first ones fix the time to first token.
  void AddOutputTokens(uint32_t n, absl::Time now);
  // The final count, when the worker reports it (end tokens included).
  void set_output_tokens(uint32_t n);
  void set_finish_reason(std::string reason);
  // Control-plane calls (health probes, scrapes) are logged at debug.
  void set_level(spdlog::level::level_enum level);

  std::optional<absl::Duration> ttft() const;
  uint32_t output_tokens() const;

  // Writes the line, once (later calls do nothing). `status` is the HTTP
  // status or the gRPC code's name.
  void Log(std::string_view status, absl::Time end);

 private:
  mutable std::mutex mu_;
  std::string api_, request_id_, key_, finish_reason_;
  absl::Time start_;
  uint32_t prompt_tokens_ = 0, output_tokens_ = 0;
  std::optional<absl::Duration> ttft_;
  spdlog::level::level_enum level_ = spdlog::level::info;
  bool logged_ = false;
};

// The finish reason of a request that failed with `status`: "cancelled",
// "deadline" (gRPC reports a passed deadline to the server as a cancel: the
// callers tell the two apart before they get here), else "error".
const char* FailedFinishReason(const absl::Status& status);

// What a batch of a RequestSession's events tells the access record of an
// HTTP generation: output tokens as they come, each choice's finish reason,
// then the final count (kUsage) or why it failed (kError).
void RecordEvents(AccessRecord& access, const std::vector<RequestEvent>& events);

}  // namespace flotilla::coordinator
