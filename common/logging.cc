#include "common/logging.h"

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "common/build_info.h"
#include "spdlog/pattern_formatter.h"
#include "spdlog/sinks/stdout_sinks.h"

namespace flotilla {
namespace {

std::atomic<bool> g_json{false};
std::string g_tag;  // --log-tag; set once by ConfigureLogging

// Marks a payload whose fields LogEvent already rendered as JSON members:
// "\x1f<event>\x1e<members>".
constexpr char kFieldsMark = '\x1f';
constexpr char kFieldsSep = '\x1e';

void AppendJsonString(std::string& out, std::string_view s) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
}

// {"time": "2024-05-01T12:00:00.123Z", "level": "info", "process": TAG,
//  "pid": N, "msg": ..., fields...}
class JsonFormatter final : public spdlog::formatter {
 public:
  explicit JsonFormatter(std::string tag) : tag_(std::move(tag)) {}

  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override {
    std::string line = "{\"time\":\"";
    const auto since = msg.time.time_since_epoch();
    const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(since);
    const auto millis = std::chrono::duration_cast<std::chrono::milliseconds>(since - seconds);
    const std::time_t t = static_cast<std::time_t>(seconds.count());
    std::tm tm{};
    gmtime_r(&t, &tm);
    char buf[40];
    std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%S", &tm);
    char ms[8];
    std::snprintf(ms, sizeof(ms), "%03d", static_cast<int>(millis.count()));
    const auto level = spdlog::level::to_string_view(msg.level);
    absl::StrAppend(&line, buf, ".", ms, "Z\",\"level\":\"");
    line.append(level.data(), level.size());
    line += "\"";
    if (!tag_.empty()) {
      line += ",\"process\":";
      AppendJsonString(line, tag_);
    }
    absl::StrAppend(&line, ",\"pid\":", getpid(), ",\"msg\":");
    const std::string_view payload(msg.payload.data(), msg.payload.size());
    if (!payload.empty() && payload.front() == kFieldsMark) {
      const size_t sep = payload.find(kFieldsSep);
      AppendJsonString(line,
                       payload.substr(1, sep == std::string_view::npos ? payload.npos : sep - 1));
      if (sep != std::string_view::npos && sep + 1 < payload.size()) {
        line += ",";
        line.append(payload.substr(sep + 1));
      }
    } else {
      AppendJsonString(line, payload);
    }
    line += "}\n";
    dest.append(line.data(), line.data() + line.size());
  }

  std::unique_ptr<spdlog::formatter> clone() const override {
    return std::make_unique<JsonFormatter>(tag_);
  }

 private:
  std::string tag_;
};

std::string TextValue(const LogField& f) {
  if (f.null) return "-";
  if (f.number) return f.value;
  const bool plain = !f.value.empty() && f.value.find_first_of(" \"=\t\n") == std::string::npos;
  if (plain) return f.value;
  std::string out;
  AppendJsonString(out, f.value);
  return out;
}

}  // namespace

LogField::LogField(std::string_view key, int64_t value) : key(key), value(absl::StrCat(value)) {
  number = true;
}
LogField::LogField(std::string_view key, uint64_t value) : key(key), value(absl::StrCat(value)) {
  number = true;
}
LogField::LogField(std::string_view key, double value) : key(key), value(absl::StrCat(value)) {
  number = true;
}
LogField LogField::Null(std::string_view key) {
  LogField f(key, "");
  f.null = true;
  return f;
}

void AddLogFlags(CLI::App& app, LogOptions* options) {
  app.add_option("--log-level", options->level,
                 "least severe log level shown: trace, debug, info, warn, error, critical, off")
      ->envname("FLOTILLA_LOG_LEVEL")
      ->capture_default_str()
      ->check(
          CLI::IsMember({"trace", "debug", "info", "warn", "warning", "error", "critical", "off"}));
  app.add_option("--log-format", options->format,
                 "log lines on stderr: text, or json (one object a line)")
      ->envname("FLOTILLA_LOG_FORMAT")
      ->capture_default_str()
      ->check(CLI::IsMember({"text", "json"}));
  app.add_option("--log-tag", options->tag,
                 "this process's name on each log line (flotilla up names its children "
                 "coordinator and worker-N)")
      ->envname("FLOTILLA_LOG_TAG");
}

std::string VersionLine(const std::string& program) {
  const BuildInfo& b = GetBuildInfo();
  std::string features = b.build_type.empty() ? "build" : b.build_type;
  if (b.cuda) features += ", cuda";
  if (b.nccl) features += ", nccl";
  if (b.ucx) features += ", ucx";
  if (b.sanitize) features += ", sanitize";
  return absl::StrCat(program, " ", b.version, " (", features, ")");
}

void AddVersionFlag(CLI::App& app, const std::string& program) {
  app.set_version_flag("--version", VersionLine(program), "print the version and exit");
}

absl::Status ConfigureLogging(const LogOptions& options) {
  const std::string level_name = options.level == "warning" ? "warn" : options.level;
  const spdlog::level::level_enum level = spdlog::level::from_str(level_name);
  if (level == spdlog::level::off && level_name != "off") {
    return absl::InvalidArgumentError(absl::StrCat("--log-level '", options.level,
                                                   "': use trace, debug, info, warn, error, "
                                                   "critical or off"));
  }
  if (options.format != "text" && options.format != "json") {
    return absl::InvalidArgumentError(
        absl::StrCat("--log-format '", options.format, "': use text or json"));
  }
  auto sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
  auto logger = std::make_shared<spdlog::logger>("flotilla", sink);
  g_json = options.format == "json";
  g_tag = options.tag;
  if (g_json) {
    logger->set_formatter(std::make_unique<JsonFormatter>(options.tag));
  } else {
    const std::string tag = options.tag.empty() ? "" : absl::StrCat("[", options.tag, "] ");
    logger->set_formatter(std::make_unique<spdlog::pattern_formatter>(
        absl::StrCat("[%Y-%m-%d %H:%M:%S.%e] ", tag, "[%l] %v")));
  }
  logger->set_level(level);
  logger->flush_on(spdlog::level::trace);
  spdlog::set_default_logger(logger);
  RouteLibraryLogs();
  return absl::OkStatus();
}

bool JsonLogs() { return g_json; }

namespace {

// The payload LogEvent hands spdlog: marked JSON members for the JSON
// formatter, else "event k=v ...".
std::string EventPayload(bool json, std::string_view event, const std::vector<LogField>& fields) {
  std::string payload;
  if (json) {
    payload += kFieldsMark;
    payload += event;
    payload += kFieldsSep;
    bool first = true;
    for (const LogField& f : fields) {
      if (!first) payload += ',';
      first = false;
      AppendJsonString(payload, f.key);
      payload += ':';
      if (f.null) {
        payload += "null";
      } else if (f.number) {
        payload += f.value;
      } else {
        AppendJsonString(payload, f.value);
      }
    }
  } else {
    payload = std::string(event);
    for (const LogField& f : fields) absl::StrAppend(&payload, " ", f.key, "=", TextValue(f));
  }
  return payload;
}

}  // namespace

void LogEvent(spdlog::level::level_enum level, std::string_view event,
              const std::vector<LogField>& fields) {
  if (!spdlog::should_log(level)) return;
  spdlog::log(level, "{}", EventPayload(g_json, event, fields));
}

std::string JsonEventLine(spdlog::level::level_enum level, std::string_view event,
                          const std::vector<LogField>& fields) {
  const std::string payload = EventPayload(true, event, fields);
  const spdlog::details::log_msg msg(spdlog::source_loc{}, "flotilla", level, payload);
  spdlog::memory_buf_t line;
  JsonFormatter(g_tag).format(msg, line);
  return std::string(line.data(), line.size());
}

}  // namespace flotilla
