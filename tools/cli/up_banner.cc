#include "tools/cli/up_banner.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "nlohmann/json.hpp"

namespace flotilla::cli {
namespace {

// `s` as one shell word.
std::string ShellQuote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

std::string HttpBase(const UpBanner& b) {
  return absl::StrCat(b.tls ? "https://" : "http://", b.http_address, "/v1");
}

}  // namespace

std::string GrpcTryCommand(const UpBanner& b) {
  std::string cmd = absl::StrCat("flotilla generate --coordinator ", b.grpc_address,
                                 " --prompt-ids 1,2,3 --max-tokens 8 --json");
  if (b.tls) absl::StrAppend(&cmd, " --tls-ca ", ShellQuote(b.tls_ca));
  if (b.tls && !b.client_cert.empty()) {
    absl::StrAppend(&cmd, " --tls-cert ", ShellQuote(b.client_cert), " --tls-key ",
                    ShellQuote(b.client_key));
  }
  if (b.needs_key) absl::StrAppend(&cmd, " --api-key KEY");
  return cmd;
}

std::string HttpTryCommand(const UpBanner& b) {
  if (b.http_address.empty()) return "";
  const nlohmann::json body = {
      {"model", b.model_id},
      {"messages", {{{"role", "user"}, {"content", "Say hello."}}}},
      {"max_tokens", 32}};
  std::string cmd = "curl -s";
  if (b.tls) absl::StrAppend(&cmd, " --cacert ", ShellQuote(b.tls_ca));
  if (b.tls && !b.client_cert.empty()) {
    absl::StrAppend(&cmd, " --cert ", ShellQuote(b.client_cert), " --key ",
                    ShellQuote(b.client_key));
  }
  absl::StrAppend(&cmd, " ", HttpBase(b), "/chat/completions");
  if (b.needs_key) absl::StrAppend(&cmd, " -H 'Authorization: Bearer KEY'");
  absl::StrAppend(&cmd, " -H 'Content-Type: application/json' -d ", ShellQuote(body.dump()));
  return cmd;
}

std::string BannerText(const UpBanner& b) {
  std::string on_gpus;
  if (!b.gpus.empty()) on_gpus = absl::StrCat(" on GPUs ", absl::StrJoin(b.gpus, ","));
  std::string out = absl::StrCat("flotilla up: serving ", b.model, " with ", b.workers,
                                 " worker(s)", on_gpus, " at ", b.grpc_address, "\n",
                                 "  model id (a request's \"model\"): ", b.model_id, "\n",
                                 "  try: ", GrpcTryCommand(b), "\n");
  if (!b.http_address.empty()) {
    absl::StrAppend(&out, "  OpenAI-compatible API: ", HttpBase(b), "\n", "  try: ",
                    HttpTryCommand(b), "\n");
  }
  if (b.needs_key) absl::StrAppend(&out, "  KEY: a key of --api-key-file\n");
  absl::StrAppend(&out, "  Ctrl-C stops every process it started.\n");
  return out;
}

std::string BannerJson(const UpBanner& b) {
  std::vector<LogField> fields = {{"model", b.model},
                                  {"model_id", b.model_id},
                                  {"workers", b.workers},
                                  {"address", b.grpc_address},
                                  {"try_grpc", GrpcTryCommand(b)}};
  if (!b.gpus.empty()) fields.emplace_back("gpus", absl::StrJoin(b.gpus, ","));
  if (!b.http_address.empty()) {
    fields.emplace_back("openai_api", HttpBase(b));
    fields.emplace_back("try_http", HttpTryCommand(b));
  }
  return JsonEventLine(spdlog::level::info, "serving", fields);
}

}  // namespace flotilla::cli
