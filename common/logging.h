// Logging for every Flotilla binary: spdlog's default logger on stderr, at
// --log-level, as text or JSON lines (--log-format), each line naming the
// process (--log-tag; `flotilla up` gives its children "coordinator" and
// "worker-N"). Structured events (the access log) carry their fields as
// key=value pairs in text and as JSON members in JSON.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "spdlog/spdlog.h"

namespace CLI {
class App;
}

namespace flotilla {

struct LogOptions {
  std::string level = "info";   // trace, debug, info, warn, error, critical, off
  std::string format = "text";  // text or json
  std::string tag;              // the process's name on each line; empty = none
};

// Adds --log-level, --log-format and --log-tag (FLOTILLA_LOG_LEVEL, ...) to
// `app`, filling `options`.
void AddLogFlags(CLI::App& app, LogOptions* options);
// Adds --version: prints "<program> <version> (<build>)" and exits 0.
void AddVersionFlag(CLI::App& app, const std::string& program);
// "flotilla-worker 0.1.0 (Release, cuda, nccl, ucx)".
std::string VersionLine(const std::string& program);

// Replaces the default logger: stderr, `options.level`, `options.format`;
// gRPC's and Protobuf's own log lines go through it too (RouteLibraryLogs).
// INVALID_ARGUMENT for an unknown level or format.
absl::Status ConfigureLogging(const LogOptions& options);
// Sends the log lines of gRPC and Protobuf through the default logger
// (library_logs.cc).
void RouteLibraryLogs();
// Whether logs are JSON lines.
bool JsonLogs();

// One field of a structured event.
struct LogField {
  LogField(std::string_view key, std::string_view value) : key(key), value(value) {}
  LogField(std::string_view key, const char* value) : key(key), value(value) {}
  LogField(std::string_view key, const std::string& value) : key(key), value(value) {}
  LogField(std::string_view key, int64_t value);
  LogField(std::string_view key, uint64_t value);
  LogField(std::string_view key, int value) : LogField(key, static_cast<int64_t>(value)) {}
  LogField(std::string_view key, uint32_t value) : LogField(key, static_cast<uint64_t>(value)) {}
  LogField(std::string_view key, double value);
  std::string key;
  std::string value;
  bool number = false;  // unquoted in JSON
  bool null = false;    // JSON null; "-" in text
  static LogField Null(std::string_view key);
};

// Logs `event` with `fields`: "event k=v k=v" in text (values with spaces or
// quotes quoted), {"msg": event, "k": v, ...} in JSON.
void LogEvent(spdlog::level::level_enum level, std::string_view event,
              const std::vector<LogField>& fields);
// The JSON line (with its newline) LogEvent would write under --log-format
// json, for output that goes elsewhere than the log (`flotilla up`'s banner
// on stdout).
std::string JsonEventLine(spdlog::level::level_enum level, std::string_view event,
                          const std::vector<LogField>& fields);

}  // namespace flotilla
