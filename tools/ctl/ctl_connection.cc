#include "tools/ctl/ctl_connection.h"

#include <chrono>
#include <utility>

namespace flotilla::ctl {

absl::StatusOr<std::unique_ptr<Connection>> Connection::Create(const ConnectionOptions& options) {
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> creds =
      MakeChannelCredentials(options.tls);
  if (!creds.ok()) return creds.status();
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  auto channel = grpc::CreateCustomChannel(options.coordinator, *creds, args);
  return std::unique_ptr<Connection>(new Connection(options, std::move(channel)));
}

Connection::Connection(ConnectionOptions options, std::shared_ptr<grpc::Channel> channel)
    : options_(std::move(options)), admin_(admin::Admin::NewStub(channel)) {}

std::unique_ptr<grpc::ClientContext> Connection::Context() const {
  auto ctx = std::make_unique<grpc::ClientContext>();
  if (!options_.api_key.empty()) ctx->AddMetadata("authorization", "Bearer " + options_.api_key);
  ctx->set_deadline(std::chrono::system_clock::now() +
                    std::chrono::milliseconds(static_cast<int64_t>(options_.timeout_s * 1000)));
  return ctx;
}

}  // namespace flotilla::ctl
