// gRPC and Protobuf write their own log lines straight to stderr, in their
// own text format; under --log-format json that breaks the one-object-a-line
// stream. Both take a handler: these send their lines through spdlog.
#include <google/protobuf/stubs/logging.h>
#include <grpc/support/log.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "spdlog/spdlog.h"

namespace flotilla {
namespace {

void GrpcLine(gpr_log_func_args* args) {
  spdlog::level::level_enum level = spdlog::level::info;
  if (args->severity == GPR_LOG_SEVERITY_DEBUG) level = spdlog::level::debug;
  if (args->severity == GPR_LOG_SEVERITY_ERROR) level = spdlog::level::err;
  LogEvent(level, args->message,
           {{"source", "grpc"}, {"file", absl::StrCat(args->file, ":", args->line)}});
}

void ProtobufLine(google::protobuf::LogLevel severity, const char* file, int line,
                  const std::string& message) {
  spdlog::level::level_enum level = spdlog::level::info;
  if (severity == google::protobuf::LOGLEVEL_WARNING) level = spdlog::level::warn;
  if (severity >= google::protobuf::LOGLEVEL_ERROR) level = spdlog::level::err;
  LogEvent(level, message, {{"source", "protobuf"}, {"file", absl::StrCat(file, ":", line)}});
}

}  // namespace

void RouteLibraryLogs() {
  gpr_set_log_function(GrpcLine);
  google::protobuf::SetLogHandler(ProtobufLine);
}

}  // namespace flotilla
